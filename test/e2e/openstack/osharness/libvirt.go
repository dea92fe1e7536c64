package osharness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
)

// The optional libvirt-driver compute (libvirt-compute.sh up): host node3,
// real QEMU/TCG guests in the machine's system libvirtd.
const (
	// LibvirtHost is the nova-compute host of libvirt-compute.sh.
	LibvirtHost = "node3"
	// LibvirtFlavor is the flavor it seeds: 256 MB, 1 vCPU, 1 GB.
	LibvirtFlavor = "lv256"
	// LibvirtImage is the root image it seeds (kernel_id, ramdisk_id and
	// os_command_line point at the busybox guest of test/guest).
	LibvirtImage = "hvg-lv-root"
	// LibvirtProject is the project libvirt-compute.sh up seeds (admin has
	// the admin role there, no Nova quota): storms boot their guests there,
	// clear of the admin project's quota that other tests lift and restore.
	LibvirtProject = "hvg-lv"
)

// ConnectLibvirt is Connect with the token scoped to LibvirtProject: servers
// it boots belong to that project; as admin it still sees and acts on every
// project's servers.
func ConnectLibvirt(ctx context.Context, workDir string) (*Harness, error) {
	return Connect(ctx, workDir, clouds.WithProjectName(LibvirtProject))
}

// Timing of one server operation, as measured by the helpers.
type Timing struct {
	ID       string
	Accepted time.Duration // the API call returned
	Done     time.Duration // the server reached the wanted state with no task
}

// LibvirtUp reports nil if node3's nova-compute is up (libvirt-compute.sh
// up has run), else an error naming what to do.
func (h *Harness) LibvirtUp(ctx context.Context) error {
	st, fd, err := h.ComputeState(ctx, LibvirtHost)
	if err != nil {
		return fmt.Errorf("%s: %w (run test/e2e/openstack/libvirt-compute.sh up)", LibvirtHost, err)
	}
	if st != "up" || fd {
		return fmt.Errorf("nova-compute on %s is %s (forced down %v): run test/e2e/openstack/libvirt-compute.sh up", LibvirtHost, st, fd)
	}
	return nil
}

// imageID returns the id of the active image named name.
func (h *Harness) imageID(ctx context.Context, name string) (string, error) {
	var out struct {
		Images []struct{ ID, Status string } `json:"images"`
	}
	ic, err := openstack.NewImageV2(h.Provider, h.Endpoints)
	if err != nil {
		return "", err
	}
	if _, err := ic.Get(ctx, ic.ServiceURL("images")+"?name="+url.QueryEscape(name), &out, nil); err != nil {
		return "", err
	}
	for _, i := range out.Images {
		if i.Status == "active" {
			return i.ID, nil
		}
	}
	return "", fmt.Errorf("no active image %q (run libvirt-compute.sh up)", name)
}

// BootLibvirt boots n real guests on node3 (flavor lv256, image
// hvg-lv-root, networks none, 2.74 host), named prefix-0..n-1, and waits
// until each is ACTIVE with no task. It returns their timings (boot = Done).
func (h *Harness) BootLibvirt(ctx context.Context, n int, prefix string) ([]Timing, error) {
	img, err := h.imageID(ctx, LibvirtImage)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	ts := make([]Timing, 0, n)
	for i := range n {
		var out struct {
			Server struct{ ID string } `json:"server"`
		}
		body := map[string]any{"server": map[string]any{
			"name": fmt.Sprintf("%s-%d", prefix, i), "imageRef": img, "flavorRef": LibvirtFlavor,
			"networks": "none", "host": LibvirtHost,
		}}
		if err := h.do(ctx, "POST", MVHostBoot, "/servers", body, &out, 202); err != nil {
			return ts, err
		}
		ts = append(ts, Timing{ID: out.Server.ID, Accepted: time.Since(t0)})
	}
	return ts, h.waitAll(ctx, ts, t0, "ACTIVE")
}

// waitAll polls every server of ts until it has status and no task,
// recording Done. One GET per pending server per second.
func (h *Harness) waitAll(ctx context.Context, ts []Timing, t0 time.Time, status string) error {
	left := len(ts)
	return poll(ctx, fmt.Sprintf("%d servers %s", len(ts), status), func() (bool, error) {
		for i := range ts {
			if ts[i].Done != 0 {
				continue
			}
			s, err := h.GetServer(ctx, ts[i].ID)
			if err != nil {
				return false, err
			}
			if s.Status == "ERROR" && status != "ERROR" {
				return false, fatal{errorState(s)}
			}
			if s.Status == status && s.TaskState == "" {
				ts[i].Done = time.Since(t0)
				left--
			}
		}
		return left == 0, nil
	})
}

// Reboot asks Nova for a soft (hard=false) or hard reboot of each server
// (all requests first, then the waits), and waits until each is ACTIVE with
// no task. Timings are from the first request.
func (h *Harness) Reboot(ctx context.Context, hard bool, ids ...string) ([]Timing, error) {
	typ := "SOFT"
	if hard {
		typ = "HARD"
	}
	return h.actionAndWait(ctx, map[string]any{"reboot": map[string]any{"type": typ}}, "ACTIVE", ids)
}

// StopServers calls the stop API (os-stop) on each server and waits until
// each is SHUTOFF with no task.
func (h *Harness) StopServers(ctx context.Context, ids ...string) ([]Timing, error) {
	return h.actionAndWait(ctx, map[string]any{"os-stop": nil}, "SHUTOFF", ids)
}

// StartServers calls the start API (os-start) and waits for ACTIVE.
func (h *Harness) StartServers(ctx context.Context, ids ...string) ([]Timing, error) {
	return h.actionAndWait(ctx, map[string]any{"os-start": nil}, "ACTIVE", ids)
}

func (h *Harness) actionAndWait(ctx context.Context, action map[string]any, status string, ids []string) ([]Timing, error) {
	t0 := time.Now()
	ts := make([]Timing, 0, len(ids))
	for _, id := range ids {
		if err := h.do(ctx, "POST", "", "/servers/"+id+"/action", action, nil, 202); err != nil {
			return ts, err
		}
		ts = append(ts, Timing{ID: id, Accepted: time.Since(t0)})
	}
	return ts, h.waitAll(ctx, ts, t0, status)
}

// WaitVMState waits until the server's vm_state is vm with no task (for
// example "stopped" after Nova's power-state sync reacted to a virsh
// destroy) and returns how long it took.
func (h *Harness) WaitVMState(ctx context.Context, id, vm string) (time.Duration, error) {
	t0 := time.Now()
	err := poll(ctx, fmt.Sprintf("server %s vm_state %s", id, vm), func() (bool, error) {
		s, err := h.GetServer(ctx, id)
		return err == nil && s.VMState == vm && s.TaskState == "", err
	})
	return time.Since(t0), err
}

// DeleteLibvirtServers deletes every server whose name starts with prefix
// that is on node3 or on no host (a boot that went to ERROR before it was
// scheduled still counts against nothing, but would outlive the run): all
// DELETE requests first, then it waits until every one is gone. It returns
// how many it deleted.
func (h *Harness) DeleteLibvirtServers(ctx context.Context, prefix string) (int, error) {
	if prefix == "" {
		return 0, errors.New("DeleteLibvirtServers: empty prefix")
	}
	var out struct{ Servers []Server }
	if err := h.do(ctx, "GET", "", "/servers/detail?all_tenants=1&name="+url.QueryEscape("^"+regexp.QuoteMeta(prefix)), nil, &out, 200); err != nil {
		return 0, err
	}
	var ids []string
	for _, s := range out.Servers {
		if strings.HasPrefix(s.Name, prefix) && (s.Host == LibvirtHost || s.Host == "") {
			ids = append(ids, s.ID)
		}
	}
	return len(ids), h.DeleteServers(ctx, ids...)
}

// ClearLibvirtLeftovers deletes the servers an earlier run of a test family
// left behind on node3 (family is the name prefix every run of that test
// uses, such as "hvg-storm-"): a run killed before its cleanup leaves its
// guests running, and the e2e cloud outlives runs (up.sh reuses it), so 20
// leftover storm guests kept 20 of node3's 32 VCPUs and the next storm's
// second boot batch got "No valid host was found". Call it holding Lock,
// which serialises the runs that boot on node3.
func (h *Harness) ClearLibvirtLeftovers(ctx context.Context, family string) (int, error) {
	return h.DeleteLibvirtServers(ctx, family)
}

// ConsoleLog is the serial console log of a node3 guest: Nova's libvirt
// driver has virtlogd write it to instances/<uuid>/console.log with
// append='off', so every QEMU start (boot, soft or hard reboot, start)
// begins it afresh.
func (h *Harness) ConsoleLog(id string) string {
	return filepath.Join(h.WorkDir, "data", "nova-"+LibvirtHost, "instances", id, "console.log")
}

// GuestReadyMark is the line the test guest's /init prints once it watches
// the ACPI power button (test/guest/init). Before it, a soft reboot's ACPI
// shutdown is ignored and Nova falls back to a hard reboot after
// wait_soft_reboot_seconds (120 s).
const GuestReadyMark = "hvg: watching power button"

// WaitGuestsReady waits until the console log of every server shows
// GuestReadyMark, i.e. the guest's current boot has finished. Call it after
// Nova reports the server ACTIVE (the log is restarted by then). It returns
// how long each took from the call.
func (h *Harness) WaitGuestsReady(ctx context.Context, ids ...string) (map[string]time.Duration, error) {
	t0 := time.Now()
	took := make(map[string]time.Duration, len(ids))
	err := poll(ctx, fmt.Sprintf("%d guests' consoles to show %q", len(ids), GuestReadyMark), func() (bool, error) {
		for _, id := range ids {
			if _, ok := took[id]; ok {
				continue
			}
			b, err := os.ReadFile(h.ConsoleLog(id))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return false, fatal{err}
			}
			if bytes.Contains(b, []byte(GuestReadyMark)) {
				took[id] = time.Since(t0)
			}
		}
		return len(took) == len(ids), nil
	})
	return took, err
}
