package controller

// SetPinMutation lets the external tests (package controller_test) turn
// pinMutation on (memory.go); it returns the function that turns it off.
func SetPinMutation(on bool) func() {
	pinMutation = on
	return func() { pinMutation = false }
}

// SetStoredMutation lets the external tests turn storedMutation on.
func SetStoredMutation(on bool) func() {
	storedMutation = on
	return func() { storedMutation = false }
}

// SetRollbackCheckMutation lets the external tests turn
// rollbackCheckMutation on.
func SetRollbackCheckMutation(on bool) func() {
	rollbackCheckMutation = on
	return func() { rollbackCheckMutation = false }
}
