package natslease

// StrictHeaders exports strictHeaders to the external tests.
var StrictHeaders = strictHeaders
