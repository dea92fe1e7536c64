package daemonkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

func problems(n NATSConfig) string {
	var p Problems
	n.Validate(p.Bad)
	if err := p.Err(); err != nil {
		return err.Error()
	}
	return ""
}

func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// Plaintext NATS to a server that is not on this host is refused unless
// allow_insecure is set (then it is a warning); TLS by scheme or by
// ca_file, and loopback servers, are fine.
func TestNATSPlaintextRefused(t *testing.T) {
	dir := t.TempDir()
	ca := writeFile(t, dir, "ca.pem", "not checked here", 0o644)
	for _, tc := range []struct {
		name string
		n    NATSConfig
		want string // "" = valid
	}{
		{"remote plaintext", NATSConfig{URLs: []string{"nats://10.0.0.5:4222"}},
			`nats.urls[0]: "nats://10.0.0.5:4222": plaintext to a server that is not on this host`},
		{"remote ws", NATSConfig{URLs: []string{"nats://127.0.0.1:4222", "ws://nats.example.org:80"}},
			`nats.urls[1]: "ws://nats.example.org:80": plaintext`},
		{"password redacted", NATSConfig{URLs: []string{"nats://u:secret@10.0.0.5:4222"}}, `"nats://u:xxxxx@10.0.0.5:4222": plaintext`},
		{"allowed", NATSConfig{URLs: []string{"nats://10.0.0.5:4222"}, AllowInsecure: true}, ""},
		{"tls scheme", NATSConfig{URLs: []string{"tls://10.0.0.5:4222"}}, ""},
		{"tls in pool", NATSConfig{URLs: []string{"nats://10.0.0.5:4222", "tls://10.0.0.6:4222"}}, ""},
		{"ca_file", NATSConfig{URLs: []string{"nats://10.0.0.5:4222"}, CAFile: ca}, ""},
		{"loopback", NATSConfig{URLs: []string{"nats://127.0.0.1:4222", "nats://localhost:4222", "nats://[::1]:4222"}}, ""},
	} {
		got := problems(tc.n)
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("%s: password in the error: %q", tc.name, got)
		}
	}
	w := NATSConfig{URLs: []string{"nats://u:secret@10.0.0.5:4222"}, AllowInsecure: true}.Warnings()
	if len(w) != 2 || !strings.Contains(w[0], "plaintext connection to nats://u:xxxxx@10.0.0.5:4222 allowed by nats.allow_insecure") ||
		!strings.Contains(w[1], "carries a password") || strings.Contains(strings.Join(w, " "), "secret") {
		t.Errorf("warnings %q", w)
	}
	if w := (NATSConfig{URLs: []string{"tls://10.0.0.5:4222"}}).Warnings(); len(w) != 0 {
		t.Errorf("TLS: warnings %q", w)
	}
}

// Every secret file (creds, NKey seed, token, password, TLS key) that its
// group or others can access is refused with the field, the file and its
// mode; only one authentication method may be set.
func TestNATSSecretFiles(t *testing.T) {
	dir := t.TempDir()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	open := func(name, content string) string { return writeFile(t, dir, name, content, 0o640) }
	base := NATSConfig{URLs: []string{"nats://127.0.0.1:4222"}}
	for _, tc := range []struct {
		field string
		mod   func(*NATSConfig, string)
		body  string
	}{
		{"nats.creds_file", func(n *NATSConfig, p string) { n.CredsFile = p }, "creds"},
		{"nats.nkey_seed_file", func(n *NATSConfig, p string) { n.NKeySeedFile = p }, string(seed)},
		{"nats.token_file", func(n *NATSConfig, p string) { n.TokenFile = p }, "tok"},
		{"nats.password_file", func(n *NATSConfig, p string) { n.User, n.PasswordFile = "agent", p }, "pw"},
		{"nats.key_file", func(n *NATSConfig, p string) { n.CertFile, n.KeyFile = p, p }, "key"},
	} {
		p := open(strings.TrimPrefix(tc.field, "nats."), tc.body)
		n := base
		tc.mod(&n, p)
		want := tc.field + `: "` + p + `": is a secret but has mode 0640`
		if got := problems(n); !strings.Contains(got, want) {
			t.Errorf("%s: got %q, want %q", tc.field, got, want)
		}
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
		if tc.field != "nats.key_file" && tc.field != "nats.creds_file" {
			if got := problems(n); got != "" {
				t.Errorf("%s mode 0600: %q", tc.field, got)
			}
		}
	}
	n := base
	n.TokenFile, n.NKeySeedFile = filepath.Join(dir, "token_file"), filepath.Join(dir, "nkey_seed_file")
	if got := problems(n); !strings.Contains(got, "only one of") {
		t.Errorf("two methods: %q", got)
	}
	n = base
	n.User = "agent"
	if got := problems(n); !strings.Contains(got, `nats.user: "agent": user and password_file go together`) {
		t.Errorf("user alone: %q", got)
	}
	n = base
	n.NKeySeedFile = writeFile(t, dir, "badseed", "SUNOTASEED", 0o600)
	if got := problems(n); !strings.Contains(got, "nats.nkey_seed_file") || !strings.Contains(got, "not a user NKey seed") {
		t.Errorf("bad seed: %q", got)
	}
}

// The token, user/password and NKey seed files authenticate against a
// real nats-server; a wrong secret is refused by it.
func TestNATSCredentialFiles(t *testing.T) {
	dir := t.TempDir()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	start := func(o *server.Options) string {
		o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		t.Cleanup(s.Shutdown)
		return s.ClientURL()
	}
	connect := func(n NATSConfig) error {
		if p := problems(n); p != "" {
			t.Fatalf("config: %s", p)
		}
		opts, err := n.Options()
		if err != nil {
			return err
		}
		nc, err := nats.Connect(n.URL(), opts...)
		if err == nil {
			nc.Close()
		}
		return err
	}
	tokenURL := start(&server.Options{Authorization: "s3cret-token"})
	userURL := start(&server.Options{Users: []*server.User{{Username: "agent", Password: "s3cret-pw"}}})
	nkeyURL := start(&server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})

	if err := connect(NATSConfig{URLs: []string{tokenURL}, TokenFile: writeFile(t, dir, "tok", "s3cret-token\n", 0o600)}); err != nil {
		t.Errorf("token file: %v", err)
	}
	if err := connect(NATSConfig{URLs: []string{tokenURL}, TokenFile: writeFile(t, dir, "tok2", "wrong\n", 0o600)}); err == nil {
		t.Error("a wrong token was accepted")
	}
	if err := connect(NATSConfig{URLs: []string{userURL}, User: "agent", PasswordFile: writeFile(t, dir, "pw", "s3cret-pw\n", 0o600)}); err != nil {
		t.Errorf("password file: %v", err)
	}
	if err := connect(NATSConfig{URLs: []string{nkeyURL}, NKeySeedFile: writeFile(t, dir, "seed", string(seed), 0o600)}); err != nil {
		t.Errorf("nkey seed file: %v", err)
	}
}

// A clouds.yaml entry with verify: false is reported when the cloud is
// used, and not otherwise.
func TestCloudsVerifyFalseWarned(t *testing.T) {
	dir := t.TempDir()
	clouds := writeFile(t, dir, "clouds.yaml", `clouds:
  lab:
    auth: {auth_url: "https://keystone.example.org:5000/v3", username: u, password: p, project_name: p, user_domain_name: Default, project_domain_name: Default}
    verify: false
  good:
    auth: {auth_url: "https://keystone.example.org:5000/v3", username: u, password: p, project_name: p, user_domain_name: Default, project_domain_name: Default}
`, 0o600)
	o := DefaultOpenStack()
	o.Cloud, o.CloudsFile = "lab", clouds
	if w := o.Warnings("reconcile.enabled"); len(w) != 1 || !strings.Contains(w[0], `cloud "lab" disables TLS verification (verify: false)`) {
		t.Errorf("verify false: %q", w)
	}
	if w := o.Warnings(""); len(w) != 0 {
		t.Errorf("cloud unused: %q", w)
	}
	o.Cloud = "good"
	if w := o.Warnings("reconcile.enabled"); len(w) != 0 {
		t.Errorf("verified cloud: %q", w)
	}
}

// writeCA writes a self-signed CA and a server certificate for 127.0.0.1
// signed by it; returns the CA file and the server's tls.Config.
func writeCA(t *testing.T, dir string) (string, *tls.Config) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hvguard test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := writeFile(t, dir, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), 0o644)
	return caFile, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}}, MinVersion: tls.VersionTLS12}
}

// ca_file makes TLS mandatory even with a nats:// URL (what Validate
// relies on to accept nats:// to a remote server with it): a TLS server
// is reached and verified; a server without TLS is refused, never spoken
// to in plaintext.
func TestNATSCAFileForcesTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, srvTLS := writeCA(t, dir)
	start := func(o *server.Options) string {
		o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		t.Cleanup(s.Shutdown)
		return fmt.Sprintf("nats://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
	}
	connect := func(url string) (*nats.Conn, error) {
		n := NATSConfig{URLs: []string{url}, CAFile: caFile}
		opts, err := n.Options()
		if err != nil {
			t.Fatal(err)
		}
		return nats.Connect(n.URL(), append(opts, nats.Timeout(2*time.Second))...)
	}
	nc, err := connect(start(&server.Options{TLSConfig: srvTLS, TLS: true}))
	if err != nil {
		t.Fatalf("TLS server with ca_file: %v", err)
	}
	if _, err := nc.TLSConnectionState(); err != nil {
		t.Errorf("connected without TLS: %v", err)
	}
	nc.Close()
	if nc, err := connect(start(&server.Options{})); err == nil {
		nc.Close()
		t.Fatal("ca_file set, server without TLS: connected in plaintext")
	} else {
		t.Logf("server without TLS refused: %v", err)
	}
}
