package daemonkit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// SecretModeMask is the permission bits a secret file must not have: any
// access by its group or by others. A secret (the peer secret, an NKey
// seed, a creds, password, token or TLS key file) that other local users
// can read lets any of them act as this daemon; the daemons refuse to
// start with one (chmod 600, owned by the daemon's user).
const SecretModeMask fs.FileMode = 0o077

// CheckSecretFile reports through bad (naming field) a secret file that
// cannot be read or is group- or world-accessible.
func CheckSecretFile(bad Bad, field, path string) {
	if err := SecretFileError(path); err != nil {
		bad(field, fmt.Sprintf("%q", path), err.Error())
	}
}

// SecretFileError returns why path is not an acceptable secret file (nil:
// it is): it cannot be read, is not a regular file, or its mode gives its
// group or others any access.
func SecretFileError(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cannot be read: %w", RootCause(err))
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("is not a regular file (%s)", st.Mode())
	}
	if m := st.Mode().Perm(); m&SecretModeMask != 0 {
		return fmt.Errorf("is a secret but has mode %04o (%s): readable or writable by its group or others; chmod 600 it", m, st.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cannot be read: %w", RootCause(err))
	}
	f.Close()
	return nil
}

// ReadSecretFile reads a secret file after SecretFileError's checks; the
// error names field and path.
func ReadSecretFile(field, path string) ([]byte, error) {
	if err := SecretFileError(path); err != nil {
		return nil, fmt.Errorf("%s: %q %w", field, path, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return b, nil
}

// RootCause unwraps err to its innermost error (an os.PathError's
// syscall error: "permission denied", without the path said already).
func RootCause(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}
