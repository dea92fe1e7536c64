// Package daemonkit holds what hvguard's daemons (hvguard-agent and
// hvguard-controller) share: the YAML duration type and strict decoding,
// the log, NATS and OpenStack configuration sections with their
// validation, systemd's notify protocol, the HTTP endpoint helper and the
// CLOCK_BOOTTIME clock. One copy, so the two daemons validate and behave
// alike.
package daemonkit
