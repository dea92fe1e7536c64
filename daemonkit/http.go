package daemonkit

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Limits of the metrics and status endpoints (ServeHTTP): their requests
// are GETs without a body and their answers small, so a client that is
// slower than this is not a scraper but a stuck or hostile connection.
const (
	// HTTPReadTimeout bounds reading a whole request.
	HTTPReadTimeout = 10 * time.Second
	// HTTPWriteTimeout bounds a request from its headers to the end of
	// the answer (a /metrics scrape renders in milliseconds).
	HTTPWriteTimeout = 30 * time.Second
	// HTTPIdleTimeout closes kept-alive connections without a request (a
	// Prometheus scrape interval is typically 15-60 s).
	HTTPIdleTimeout = 90 * time.Second
	// HTTPMaxHeaderBytes: 64 KiB of headers is plenty for a GET.
	HTTPMaxHeaderBytes = 64 << 10
)

// ServeHTTP serves handler on ln in the background (what names it in the
// logs) with the limits above and returns its stop: a graceful shutdown
// bounded by 2 s.
func ServeHTTP(ln net.Listener, handler http.Handler, readHeaderTimeout time.Duration, log *slog.Logger, what string) (stop func()) {
	return Serve(ln, &http.Server{Handler: handler, ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout: HTTPReadTimeout, WriteTimeout: HTTPWriteTimeout, IdleTimeout: HTTPIdleTimeout,
		MaxHeaderBytes: HTTPMaxHeaderBytes}, log, what)
}

// Serve runs srv on ln in the background and returns its stop.
func Serve(ln net.Listener, srv *http.Server, log *slog.Logger, what string) (stop func()) {
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(what+" failed", "err", err)
		}
	}()
	log.Info(what+" listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}
