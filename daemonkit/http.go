package daemonkit

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ServeHTTP serves handler on ln in the background (what names it in the
// logs) and returns its stop: a graceful shutdown bounded by 2 s.
func ServeHTTP(ln net.Listener, handler http.Handler, readHeaderTimeout time.Duration, log *slog.Logger, what string) (stop func()) {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: readHeaderTimeout}
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
