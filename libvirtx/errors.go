package libvirtx

import (
	"errors"
	"strings"

	"libvirt.org/go/libvirt"
)

// Sentinel errors. They are always returned wrapped, with a "libvirtx: <op>
// <uuid>:" prefix; test with errors.Is.
var (
	// ErrNotConnected is wrapped by every error of a call made while there is
	// no libvirt connection (before a reconnect has succeeded, or after
	// Close), and by errors that libvirt reports as a lost connection.
	ErrNotConnected = errors.New("not connected to libvirt")

	// ErrNoMetadata is returned (wrapped) by Metadata when the domain has no
	// metadata element in the requested namespace.
	ErrNoMetadata = errors.New("no metadata in this namespace")

	// ErrNoDomain is wrapped by errors of operations on a UUID that names no
	// domain. (State does not return it: it reports lifecycle.StateGone.)
	ErrNoDomain = errors.New("no such domain")

	// ErrInvalidState is wrapped when libvirt refuses an operation because of
	// the domain's current state (VIR_ERR_OPERATION_INVALID), e.g. Destroy
	// or Suspend of a domain that is not running, Resume of one not paused.
	ErrInvalidState = errors.New("operation invalid in the domain's current state")
)

// virError extracts the libvirt error from err, if any.
func virError(err error) (libvirt.Error, bool) {
	var ve libvirt.Error
	if errors.As(err, &ve) {
		return ve, true
	}
	return ve, false
}

// isConnLoss reports whether err means that the connection to libvirt is
// gone (as opposed to an error about one domain or operation). It follows
// kubevirt: classify by libvirt error code, and for generic codes by the
// error's domain (RPC or remote driver) and message.
func isConnLoss(err error) bool {
	ve, ok := virError(err)
	if !ok {
		return false
	}
	switch ve.Code {
	case libvirt.ERR_INVALID_CONN, libvirt.ERR_RPC, libvirt.ERR_NO_CONNECT:
		return true
	case libvirt.ERR_SYSTEM_ERROR, libvirt.ERR_INTERNAL_ERROR, libvirt.ERR_OPERATION_FAILED:
		if ve.Domain == libvirt.FROM_RPC || ve.Domain == libvirt.FROM_REMOTE {
			return true
		}
	}
	msg := strings.ToLower(ve.Message)
	for _, s := range []string{
		"client socket is closed",
		"end of file while reading data",
		"cannot write data: broken pipe",
		"connection reset by peer",
		"no connection driver available",
		"keepalive timeout",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// isCode reports whether err is a libvirt error with the given code.
func isCode(err error, code libvirt.ErrorNumber) bool {
	ve, ok := virError(err)
	return ok && ve.Code == code
}
