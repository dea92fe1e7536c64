//go:build bench

// Package bench holds hvguard's benchmarks that need more than one package:
// the debouncer against a Nova-style delay-only baseline on the same event
// stream, the real agent end to end (libvirt test driver → agent → embedded
// NATS JetStream → consumer) for real-stop latency and throughput, and the
// agent's resident memory measured on a separate process.
//
// Everything here is behind the "bench" build tag so that `make test` never
// compiles or runs it; `make bench` (scripts/bench.sh) runs it with
// `go test -tags bench`. The figures and how to read them are in
// docs/BENCHMARKS.md.
package bench
