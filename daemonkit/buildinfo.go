package daemonkit

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo is the commit the binary was built from (the vcs.revision Go
// embeds when it builds inside a git checkout, "-dirty" appended for a
// modified tree; "unknown" without one).
func BuildInfo() (commit string) {
	commit = "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return commit
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && commit != "unknown" {
		commit += "-dirty"
	}
	return commit
}

// BuildInfoGauge is hvguard_build_info{version,goversion,commit} = 1, the
// Prometheus convention for joining a version onto other series
// (`* on(instance) group_left(version) hvguard_build_info`). Both daemons
// register it; daemon says which one ("agent", "controller").
func BuildInfoGauge(daemon, version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hvguard_build_info",
		Help: "Always 1; labels: the daemon, its version (release), the Go version and the commit it was built from.",
		ConstLabels: prometheus.Labels{
			"daemon": daemon, "version": version, "goversion": runtime.Version(), "commit": BuildInfo(),
		},
	})
	g.Set(1)
	return g
}
