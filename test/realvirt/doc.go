// Package realvirt holds hvguard's "real daemon" test tier: tests of the
// libvirtx package against a real libvirtd and a real QEMU/TCG guest. The
// tests carry the build tag realvirt and are run by run.sh (which first runs
// test/libvirtd/start.sh and test/guest/build.sh):
//
//	go test -tags realvirt ./test/realvirt/
//
// Daemons used:
//   - the host's system libvirtd (started by start.sh) for the cross-process
//     test-driver test (test+unix:///default) and the QEMU guest test
//     (qemu:///system). Neither disturbs the daemon: each test works on its
//     own uniquely named domains and removes them.
//   - a private, unprivileged libvirtd started by the test itself (as user
//     nobody, socket in a temporary directory) for the tests that kill,
//     restart and hang the daemon, so that they never disrupt other users of
//     the host's libvirtd (other engineers, other CI jobs, running guests).
//
// Every test skips with a message if the daemon it needs is not reachable.
// The hang test (SIGSTOP, ~30 s) is skipped with -short.
package realvirt
