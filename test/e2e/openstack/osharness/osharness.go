// Package osharness drives the real OpenStack control plane that
// test/e2e/openstack/up.sh starts (keystone, placement, glance, Nova Zed with
// two fake-driver computes node1 and node2, a Neutron stand-in), for hvguard's
// e2e tests of rejoin reconciliation: boot servers on node1, kill node1's
// nova-compute and force it down, evacuate to node2, cold-migrate back, stop
// and start nova-api, and read /os-migrations and /servers exactly as the
// agent will.
//
// Every call takes a context; waits poll every second until the context ends.
// Service start/stop goes through ctl.sh (pid files, never process names).
package osharness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
)

// CloudName is the clouds.yaml entry up.sh writes.
const CloudName = "hvguard-e2e"

// DefaultWorkDir is up.sh's work dir unless HVG_OS_WORKDIR is set.
const DefaultWorkDir = "/var/tmp/hvguard-e2e"

// Microversions used by the helper.
const (
	MVForcedDown = "2.53" // PUT /os-services/{uuid} forced_down, UUID ids
	MVMigrate    = "2.56" // migrate with a target host
	MVPaging     = "2.59" // /os-migrations uuid, limit/marker, newest first
	MVHostBoot   = "2.74" // boot with "host" (admin)
	MVMax        = "2.93" // Nova 26 (Zed) maximum; evacuate
)

// WorkDir returns $HVG_OS_WORKDIR or DefaultWorkDir.
func WorkDir() string {
	if d := os.Getenv("HVG_OS_WORKDIR"); d != "" {
		return d
	}
	return DefaultWorkDir
}

// ScriptDir is the directory holding up.sh, down.sh and ctl.sh.
func ScriptDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Harness is an authenticated admin client of the harness cloud.
type Harness struct {
	WorkDir   string
	ScriptDir string
	Provider  *gophercloud.ProviderClient
	// Compute is the Nova client at microversion 2.1 (no header); Raw and the
	// helpers pick the microversion per request.
	Compute *gophercloud.ServiceClient
	// Endpoints are the region/interface from clouds.yaml.
	Endpoints gophercloud.EndpointOpts
}

// Connect authenticates as admin with workDir/clouds.yaml; opts override
// it (ConnectLibvirt scopes the token to another project).
func Connect(ctx context.Context, workDir string, opts ...clouds.ParseOption) (*Harness, error) {
	ao, eo, _, err := clouds.Parse(append([]clouds.ParseOption{clouds.WithCloudName(CloudName),
		clouds.WithLocations(filepath.Join(workDir, "clouds.yaml"))}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("clouds.yaml: %w", err)
	}
	ao.AllowReauth = true
	pc, err := config.NewProviderClient(ctx, ao)
	if err != nil {
		return nil, fmt.Errorf("keystone auth: %w", err)
	}
	cc, err := openstack.NewComputeV2(pc, eo)
	if err != nil {
		return nil, err
	}
	return &Harness{WorkDir: workDir, ScriptDir: ScriptDir(), Provider: pc, Compute: cc, Endpoints: eo}, nil
}

// Lock takes an exclusive flock on WorkDir/scenario.lock, waiting (polling)
// until ctx ends. The cloud is one per machine and shared by every test that
// uses it: a test that stops services, forces hosts down or evacuates should
// hold the lock for its whole scenario. The lock is released by unlock or
// when the process exits.
func (h *Harness) Lock(ctx context.Context) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(h.WorkDir, "scenario.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	err = poll(ctx, "scenario lock "+f.Name(), func() (bool, error) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		if err != nil {
			return false, fatal{err}
		}
		return true, nil
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// Response is one raw API exchange.
type Response struct {
	Method       string
	Path         string // relative to the compute endpoint, with query
	Microversion string // "" = none sent (2.1)
	RequestBody  any    // as passed to Raw (nil for none)
	Status       int
	Header       http.Header
	Body         []byte
}

// JSON decodes the body into v.
func (r *Response) JSON(v any) error { return json.Unmarshal(r.Body, v) }

// Raw sends one request to Nova at microversion mv ("" = 2.1) and returns
// the response whatever its status (err only for transport failures).
// path is relative to the compute endpoint, e.g. "/os-migrations?limit=2".
func (h *Harness) Raw(ctx context.Context, method, mv, path string, body any) (*Response, error) {
	c := *h.Compute
	c.Microversion = mv
	return rawRequest(ctx, &c, method, path, body, nil)
}

// do is Raw that fails unless the status is one of ok, decoding into out.
func (h *Harness) do(ctx context.Context, method, mv, path string, body, out any, ok ...int) error {
	c := *h.Compute
	c.Microversion = mv
	return doOn(ctx, &c, method, path, body, out, ok...)
}

// Server is what the tests need of a server.
type Server struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Status       string `json:"status"`
	Host         string `json:"OS-EXT-SRV-ATTR:host"`
	Node         string `json:"OS-EXT-SRV-ATTR:hypervisor_hostname"`
	InstanceName string `json:"OS-EXT-SRV-ATTR:instance_name"`
	TaskState    string `json:"OS-EXT-STS:task_state"`
	VMState      string `json:"OS-EXT-STS:vm_state"`
	// Fault is set on a server in ERROR (for example "No valid host was
	// found." when placement had no room).
	Fault *struct {
		Message string `json:"message"`
	} `json:"fault,omitempty"`
}

// errorState is the error for a server that went to ERROR, with Nova's
// fault message when there is one.
func errorState(s Server) error {
	if s.Fault != nil && s.Fault.Message != "" {
		return fmt.Errorf("server %s went to ERROR: %s", s.ID, s.Fault.Message)
	}
	return fmt.Errorf("server %s went to ERROR", s.ID)
}

// Migration is one /os-migrations entry (fields up to 2.80).
type Migration struct {
	ID            int    `json:"id"`
	UUID          string `json:"uuid"`
	InstanceUUID  string `json:"instance_uuid"`
	SourceCompute string `json:"source_compute"`
	SourceNode    string `json:"source_node"`
	DestCompute   string `json:"dest_compute"`
	DestNode      string `json:"dest_node"`
	DestHost      string `json:"dest_host"`
	Status        string `json:"status"`
	MigrationType string `json:"migration_type"`
	CreatedAt     string `json:"created_at"`
	UpdatedAt     string `json:"updated_at"`
}

// ImageID returns the id of the seeded image "hvg-fake".
func (h *Harness) ImageID(ctx context.Context) (string, error) {
	var out struct {
		Images []struct{ ID, Status string } `json:"images"`
	}
	// through Nova's image proxy would need mv <= 2.35: ask glance directly
	ic, err := openstack.NewImageV2(h.Provider, h.Endpoints)
	if err != nil {
		return "", err
	}
	if _, err := ic.Get(ctx, ic.ServiceURL("images")+"?name=hvg-fake", &out, nil); err != nil {
		return "", err
	}
	for _, i := range out.Images {
		if i.Status == "active" {
			return i.ID, nil
		}
	}
	return "", errors.New(`no active image "hvg-fake" (run up.sh)`)
}

// BootServers boots n servers (flavor "tiny", image "hvg-fake", networks
// "none") on host with the 2.74 "host" field, named prefix-0..n-1, and
// waits until all are ACTIVE there. It returns their ids in order.
func (h *Harness) BootServers(ctx context.Context, n int, host, prefix string) ([]string, error) {
	img, err := h.ImageID(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, n)
	for i := 0; i < n; i++ {
		var out struct {
			Server struct{ ID string } `json:"server"`
		}
		body := map[string]any{"server": map[string]any{
			"name": fmt.Sprintf("%s-%d", prefix, i), "imageRef": img, "flavorRef": "tiny",
			"networks": "none", "host": host,
		}}
		if err := h.do(ctx, "POST", MVHostBoot, "/servers", body, &out, 202); err != nil {
			return ids, err
		}
		ids = append(ids, out.Server.ID)
	}
	for _, id := range ids {
		if _, err := h.WaitServer(ctx, id, "ACTIVE", host); err != nil {
			return ids, err
		}
	}
	return ids, nil
}

// GetServer returns the server (admin view, mv 2.1).
func (h *Harness) GetServer(ctx context.Context, id string) (Server, error) {
	var out struct{ Server Server }
	err := h.do(ctx, "GET", "", "/servers/"+id, nil, &out, 200)
	return out.Server, err
}

// ServersOnHost lists servers of every project whose host is host.
func (h *Harness) ServersOnHost(ctx context.Context, host string) ([]Server, error) {
	var out struct{ Servers []Server }
	err := h.do(ctx, "GET", "", "/servers/detail?all_tenants=1&host="+url.QueryEscape(host), nil, &out, 200)
	return out.Servers, err
}

// fatal marks an error that ends a poll at once (others are retried).
type fatal struct{ error }

func (f fatal) Unwrap() error { return f.error }

// poll calls f every second until it returns done, a fatal error, or ctx ends.
func poll(ctx context.Context, what string, f func() (bool, error)) error {
	var last error
	for {
		done, err := f()
		if err == nil && done {
			return nil
		}
		var ft fatal
		if errors.As(err, &ft) {
			return ft.error
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}

// WaitServer waits until the server has status (and, if host != "", is on
// host with no task_state). A server in ERROR fails at once unless status is
// ERROR.
func (h *Harness) WaitServer(ctx context.Context, id, status, host string) (Server, error) {
	var s Server
	err := poll(ctx, fmt.Sprintf("server %s %s on %q", id, status, host), func() (bool, error) {
		var err error
		if s, err = h.GetServer(ctx, id); err != nil {
			return false, err
		}
		if s.Status == "ERROR" && status != "ERROR" {
			return false, fatal{errorState(s)}
		}
		return s.Status == status && (host == "" || (s.Host == host && s.TaskState == "")), nil
	})
	return s, err
}

// ComputeServiceID returns the UUID of nova-compute on host (mv 2.53).
func (h *Harness) ComputeServiceID(ctx context.Context, host string) (string, error) {
	var out struct {
		Services []struct{ ID string } `json:"services"`
	}
	if err := h.do(ctx, "GET", MVForcedDown, "/os-services?binary=nova-compute&host="+url.QueryEscape(host), nil, &out, 200); err != nil {
		return "", err
	}
	if len(out.Services) != 1 {
		return "", fmt.Errorf("%d nova-compute services on %s", len(out.Services), host)
	}
	return out.Services[0].ID, nil
}

// ForceDown sets forced_down on host's nova-compute (PUT /os-services/{uuid},
// mv 2.53). Nova refuses false (400) while a "done" evacuation from host
// exists: restart the host's nova-compute first (StartCompute).
func (h *Harness) ForceDown(ctx context.Context, host string, down bool) error {
	id, err := h.ComputeServiceID(ctx, host)
	if err != nil {
		return err
	}
	return h.do(ctx, "PUT", MVForcedDown, "/os-services/"+id, map[string]any{"forced_down": down}, nil, 200)
}

// ComputeState returns state ("up"/"down") and forced_down of host's nova-compute.
func (h *Harness) ComputeState(ctx context.Context, host string) (state string, forcedDown bool, err error) {
	var out struct {
		Services []struct {
			State      string `json:"state"`
			ForcedDown bool   `json:"forced_down"`
		} `json:"services"`
	}
	if err = h.do(ctx, "GET", MVForcedDown, "/os-services?binary=nova-compute&host="+url.QueryEscape(host), nil, &out, 200); err != nil {
		return "", false, err
	}
	if len(out.Services) != 1 {
		return "", false, fmt.Errorf("%d nova-compute services on %s", len(out.Services), host)
	}
	return out.Services[0].State, out.Services[0].ForcedDown, nil
}

// WaitComputeUp waits until host's nova-compute is "up" and not forced down.
func (h *Harness) WaitComputeUp(ctx context.Context, host string) error {
	return poll(ctx, "nova-compute on "+host+" up", func() (bool, error) {
		st, fd, err := h.ComputeState(ctx, host)
		return st == "up" && !fd, err
	})
}

// Ctl runs ctl.sh with args (start|stop|kill NAME, status) and returns its output.
func (h *Harness) Ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(h.ScriptDir, "ctl.sh")}, args...)...)
	cmd.Env = append(os.Environ(), "HVG_OS_WORKDIR="+h.WorkDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctl.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// StopCompute stops host's nova-compute process (SIGTERM). Nova still shows
// it "up" for service_down_time (60 s) unless it is also forced down.
func (h *Harness) StopCompute(ctx context.Context, host string) error {
	_, err := h.Ctl(ctx, "stop", "nova-compute-"+host)
	return err
}

// StartCompute starts host's nova-compute and waits until it reported to
// Nova. On start it runs _destroy_evacuated_instances: evacuations from host
// turn from done to completed.
func (h *Harness) StartCompute(ctx context.Context, host string) error {
	_, err := h.Ctl(ctx, "start", "nova-compute-"+host)
	return err
}

// StopAPI stops nova-api (SIGTERM): every compute API call then fails with
// connection refused, as in "Nova stopped mid-reconcile". Keystone stays up.
func (h *Harness) StopAPI(ctx context.Context) error {
	_, err := h.Ctl(ctx, "stop", "nova-api")
	return err
}

// KillAPI SIGKILLs nova-api (in-flight requests are cut).
func (h *Harness) KillAPI(ctx context.Context) error {
	_, err := h.Ctl(ctx, "kill", "nova-api")
	return err
}

// StartAPI starts nova-api and waits until it answers.
func (h *Harness) StartAPI(ctx context.Context) error {
	_, err := h.Ctl(ctx, "start", "nova-api")
	return err
}

// Evacuate asks Nova to evacuate the server (mv 2.93, no target host: the
// scheduler picks one; with two computes that is the other one). The source
// compute must be down (forced down, or stopped for service_down_time).
func (h *Harness) Evacuate(ctx context.Context, id string) error {
	return h.do(ctx, "POST", MVMax, "/servers/"+id+"/action", map[string]any{"evacuate": map[string]any{}}, nil, 200)
}

// Migrations lists /os-migrations at mv with query q (nil = none),
// following migrations_links when mv >= 2.59 (newest first there).
func (h *Harness) Migrations(ctx context.Context, mv string, q url.Values) ([]Migration, error) {
	path := "/os-migrations"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var all []Migration
	for pages := 0; path != ""; pages++ {
		if pages > 1000 {
			return all, errors.New("more than 1000 pages of migrations")
		}
		var out struct {
			Migrations []Migration                  `json:"migrations"`
			Links      []struct{ Href, Rel string } `json:"migrations_links"`
		}
		if err := h.do(ctx, "GET", mv, path, nil, &out, 200); err != nil {
			return all, err
		}
		all = append(all, out.Migrations...)
		path = ""
		for _, l := range out.Links {
			if l.Rel == "next" {
				u, err := url.Parse(l.Href)
				if err != nil {
					return all, err
				}
				path = "/os-migrations?" + u.RawQuery
			}
		}
	}
	return all, nil
}

// WaitMigration waits until the newest migration of the server with type
// mtype ("evacuation", "migration", ...) has status (e.g. "done",
// "completed", "confirmed"), and returns it. Status "error" or "failed" ends
// the wait at once unless asked for.
func (h *Harness) WaitMigration(ctx context.Context, serverID, mtype, status string) (Migration, error) {
	var m Migration
	err := poll(ctx, fmt.Sprintf("%s of %s to be %s", mtype, serverID, status), func() (bool, error) {
		ms, err := h.Migrations(ctx, MVPaging, url.Values{"instance_uuid": {serverID}, "migration_type": {mtype}})
		if err != nil || len(ms) == 0 {
			return false, err
		}
		m = ms[0] // newest first at >= 2.59
		if m.Status != status && (m.Status == "error" || m.Status == "failed") {
			return false, fatal{fmt.Errorf("%s of %s is %s", mtype, serverID, m.Status)}
		}
		return m.Status == status, nil
	})
	return m, err
}

// EvacuateAndWait evacuates each server and waits until it is ACTIVE on
// dest with its evacuation migration "done".
func (h *Harness) EvacuateAndWait(ctx context.Context, dest string, ids ...string) error {
	for _, id := range ids {
		if err := h.Evacuate(ctx, id); err != nil {
			return err
		}
	}
	for _, id := range ids {
		if _, err := h.WaitServer(ctx, id, "ACTIVE", dest); err != nil {
			return err
		}
		if _, err := h.WaitMigration(ctx, id, "evacuation", "done"); err != nil {
			return err
		}
	}
	return nil
}

// ColdMigrate moves the server to host (mv 2.56 migrate with host), waits
// for VERIFY_RESIZE, confirms, and waits until it is ACTIVE on host. host's
// nova-compute must be up and not forced down (Nova never targets a forced
// down host).
func (h *Harness) ColdMigrate(ctx context.Context, id, host string) error {
	if err := h.do(ctx, "POST", MVMigrate, "/servers/"+id+"/action", map[string]any{"migrate": map[string]any{"host": host}}, nil, 202); err != nil {
		return err
	}
	if _, err := h.WaitServer(ctx, id, "VERIFY_RESIZE", ""); err != nil {
		return err
	}
	if err := h.do(ctx, "POST", "", "/servers/"+id+"/action", map[string]any{"confirmResize": nil}, nil, 204); err != nil {
		return err
	}
	_, err := h.WaitServer(ctx, id, "ACTIVE", host)
	return err
}

// DeleteServer deletes the server and waits until GET answers 404.
func (h *Harness) DeleteServer(ctx context.Context, id string) error {
	return h.DeleteServers(ctx, id)
}

// DeleteServers sends every DELETE first, then waits until GET answers 404
// for each.
func (h *Harness) DeleteServers(ctx context.Context, ids ...string) error {
	var errs []error
	for _, id := range ids {
		errs = append(errs, h.do(ctx, "DELETE", "", "/servers/"+id, nil, nil, 204, 404))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, id := range ids {
		if err := poll(ctx, "server "+id+" gone", func() (bool, error) {
			r, err := h.Raw(ctx, "GET", "", "/servers/"+id, nil)
			if err != nil {
				return false, err
			}
			return r.Status == 404, nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// RestoreHost brings host back to normal after an evacuation test: starts
// its nova-compute (done evacuations turn completed), clears forced_down
// (retried: Nova refuses it until the restart has taken effect) and waits
// until the service is up.
func (h *Harness) RestoreHost(ctx context.Context, host string) error {
	if err := h.StartCompute(ctx, host); err != nil {
		return err
	}
	if err := poll(ctx, "forced_down=false on "+host, func() (bool, error) {
		err := h.ForceDown(ctx, host, false)
		return err == nil, err
	}); err != nil {
		return err
	}
	return h.WaitComputeUp(ctx, host)
}
