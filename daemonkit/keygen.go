package daemonkit

import (
	"flag"
	"fmt"
	"io"
	"os"

	"hvguard/fencing/keyfile"
)

// Keygen is the `keygen` subcommand of both daemons (signed lease records,
// docs/security.md): it writes a new private key (an nkey user seed,
// mode 0600, never over an existing file) to PATH (default defPath) and
// prints its public key, or with --show prints the public key of an
// existing one. name is the command ("hvguard-agent"), line formats the
// line to add to the fleet's configuration from the public key.
func Keygen(name, defPath string, args []string, stdout, stderr io.Writer, line func(pub string) string) int {
	fs := flag.NewFlagSet(name+" keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	show := fs.Bool("show", false, "print the public key of an existing key file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s keygen [--show] [PATH]   (default %s)\n", name, defPath)
		fmt.Fprintf(stderr, "Writes a new signing key (nkey user seed, mode 0600; never overwrites) and prints its public key.\n")
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	path := defPath
	switch fs.NArg() {
	case 0:
	case 1:
		path = fs.Arg(0)
	default:
		fs.Usage()
		return 2
	}
	var pub string
	if *show {
		s, err := keyfile.Signer(path)
		if err != nil {
			fmt.Fprintf(stderr, "%s keygen: %v\n", name, err)
			return 1
		}
		pub = s.ID
	} else {
		var err error
		if pub, err = keyfile.Generate(path); err != nil {
			fmt.Fprintf(stderr, "%s keygen: %v\n", name, err)
			return 1
		}
		fmt.Fprintf(stderr, "%s keygen: private key written to %s (mode 0600)\n", name, path)
	}
	fmt.Fprintln(stdout, line(pub))
	return 0
}

// Hostname returns os.Hostname or "HOST".
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "HOST"
	}
	return h
}
