// Command natsd is a single NATS server with JetStream for the tests that
// run real binaries (the packaged controller under systemd): the embedded
// nats-server/v2 the Go tests use, as a process. Not shipped.
//
//	natsd -listen 127.0.0.1:4222 -store /var/lib/natsd
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:4222", "client address host:port")
	store := flag.String("store", "", "JetStream store directory (required)")
	flag.Parse()
	host, p, err := net.SplitHostPort(*listen)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || *store == "" {
		fmt.Fprintln(os.Stderr, "usage: natsd -listen host:port -store DIR")
		os.Exit(2)
	}
	s, err := server.NewServer(&server.Options{Host: host, Port: port, JetStream: true, StoreDir: *store, NoSigs: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsd:", err)
		os.Exit(1)
	}
	s.ConfigureLogger()
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		fmt.Fprintln(os.Stderr, "natsd: not ready within 10 s")
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
}
