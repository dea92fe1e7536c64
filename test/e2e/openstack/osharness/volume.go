package osharness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
)

// Cinder and service tokens (up.sh): cinder-api on :8776 (catalog types
// volumev3 and block-storage), one cinder-volume with two fake backends.
const (
	// ServiceCloudName is the clouds.yaml entry of hvguard's service user:
	// role "service" only, project "service". Its token is what Cinder needs
	// as X-Service-Token to delete or force-detach an attachment Nova still
	// uses (OSSA-2023-003; shared/reference/openstack.md).
	ServiceCloudName = "hvguard-service"
	// VolumeTypeImage is the volume type of the backend that can make a
	// volume from a glance image (hvg_cinder_driver.ImageFakeDriver).
	VolumeTypeImage = "hvg-image"
	// VolumeTypeFake is python3-cinder's FakeLoggingVolumeDriver backend.
	VolumeTypeFake = "hvg-fake"
	// MVVolume is the Cinder microversion of the helpers' requests: 3.27
	// lists attachments with attachment ids in the volume view; the
	// attachments API (/attachments) needs >= 3.27 too. Cinder 21 max: 3.70.
	MVVolume = "3.27"
)

// Masakari (HVG_OS_MASAKARI=1 up.sh): masakari-api on :15868, service type
// instance-ha, segment MasakariSegment with hosts node1 and node2.
const (
	MasakariSegment = "hvg-segment"
	// MVMasakari is the Masakari API version of the helpers: 1.0, because
	// GET /notifications/{id} answers 500 at >= 1.1 here (python3-taskflow
	// 5.0.0 without its alembic files, so [taskflow] connection is unset).
	MVMasakari = "1.0"
)

// Volume is Cinder's view of a volume.
type Volume struct {
	ID          string             `json:"id"`
	Name        string             `json:"name"`
	Status      string             `json:"status"`
	Multiattach bool               `json:"multiattach"`
	Bootable    string             `json:"bootable"`
	VolumeType  string             `json:"volume_type"`
	Attachments []VolumeAttachment `json:"attachments"`
}

// VolumeAttachment is one entry of a volume's attachments (3.27 view).
type VolumeAttachment struct {
	AttachmentID string `json:"attachment_id"`
	ServerID     string `json:"server_id"`
	HostName     string `json:"host_name"`
	Device       string `json:"device"`
}

// BlockStorage is a Cinder v3 client at microversion mv ("" = 3.0) with
// the admin token.
func (h *Harness) BlockStorage(mv string) (*gophercloud.ServiceClient, error) {
	c, err := openstack.NewBlockStorageV3(h.Provider, h.Endpoints)
	if err != nil {
		return nil, fmt.Errorf("block-storage endpoint: %w", err)
	}
	c.Microversion = mv
	return c, nil
}

// VolumeRaw sends one request to Cinder at microversion mv with extra
// headers (e.g. X-Service-Token) and returns the response whatever its
// status. path is relative to the project's v3 endpoint, e.g.
// "/volumes/ID/action".
func (h *Harness) VolumeRaw(ctx context.Context, method, mv, path string, body any, hdr map[string]string) (*Response, error) {
	c, err := h.BlockStorage(mv)
	if err != nil {
		return nil, err
	}
	return rawRequest(ctx, c, method, path, body, hdr)
}

// rawRequest sends one request on c; every status is an answer.
func rawRequest(ctx context.Context, c *gophercloud.ServiceClient, method, path string, body any, hdr map[string]string) (*Response, error) {
	opts := &gophercloud.RequestOpts{KeepResponseBody: true, MoreHeaders: hdr}
	for code := 100; code < 600; code++ {
		opts.OkCodes = append(opts.OkCodes, code)
	}
	if body != nil {
		opts.JSONBody = body
	}
	resp, err := c.Request(ctx, method, c.ServiceURL(strings.TrimPrefix(path, "/")), opts)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &Response{Method: method, Path: path, Microversion: c.Microversion, RequestBody: body,
		Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// doOn is rawRequest that fails unless the status is one of ok, decoding into out.
func doOn(ctx context.Context, c *gophercloud.ServiceClient, method, path string, body, out any, ok ...int) error {
	r, err := rawRequest(ctx, c, method, path, body, nil)
	if err != nil {
		return err
	}
	for _, code := range ok {
		if r.Status == code {
			if out != nil && len(r.Body) > 0 {
				return r.JSON(out)
			}
			return nil
		}
	}
	return fmt.Errorf("%s %s (mv %s): HTTP %d: %s", method, path, c.Microversion, r.Status, strings.TrimSpace(string(r.Body)))
}

// GetVolume returns Cinder's view of the volume (3.27: attachment ids).
func (h *Harness) GetVolume(ctx context.Context, id string) (Volume, error) {
	c, err := h.BlockStorage(MVVolume)
	if err != nil {
		return Volume{}, err
	}
	var out struct{ Volume Volume }
	err = doOn(ctx, c, "GET", "/volumes/"+id, nil, &out, 200)
	return out.Volume, err
}

// CreateVolumeFromImage creates a 1 GB volume of type hvg-image from the
// image "hvg-fake" with multiattach=False and waits until it is available.
func (h *Harness) CreateVolumeFromImage(ctx context.Context, name string) (string, error) {
	img, err := h.ImageID(ctx)
	if err != nil {
		return "", err
	}
	c, err := h.BlockStorage(MVVolume)
	if err != nil {
		return "", err
	}
	var out struct{ Volume Volume }
	body := map[string]any{"volume": map[string]any{
		"name": name, "size": 1, "imageRef": img, "volume_type": VolumeTypeImage, "multiattach": false,
	}}
	if err := doOn(ctx, c, "POST", "/volumes", body, &out, 202); err != nil {
		return "", err
	}
	_, err = h.WaitVolume(ctx, out.Volume.ID, "available")
	return out.Volume.ID, err
}

// WaitVolume waits until the volume has status; "error" ends the wait at
// once unless asked for.
func (h *Harness) WaitVolume(ctx context.Context, id, status string) (Volume, error) {
	var v Volume
	err := poll(ctx, fmt.Sprintf("volume %s %s", id, status), func() (bool, error) {
		var err error
		if v, err = h.GetVolume(ctx, id); err != nil {
			return false, err
		}
		if v.Status != status && strings.HasPrefix(v.Status, "error") {
			return false, fatal{fmt.Errorf("volume %s is %s (see log/cinder-volume.log)", id, v.Status)}
		}
		return v.Status == status, nil
	})
	return v, err
}

// BootFromVolume boots a server from the volume (block_device_mapping_v2,
// boot index 0, delete_on_termination false) on host (2.74 "host"),
// flavor tiny, networks none, and waits until it is ACTIVE there.
func (h *Harness) BootFromVolume(ctx context.Context, host, name, volumeID string) (string, error) {
	var out struct {
		Server struct{ ID string } `json:"server"`
	}
	body := map[string]any{"server": map[string]any{
		"name": name, "flavorRef": "tiny", "networks": "none", "host": host, "imageRef": "",
		"block_device_mapping_v2": []map[string]any{{
			"boot_index": 0, "uuid": volumeID, "source_type": "volume", "destination_type": "volume",
			"delete_on_termination": false,
		}},
	}}
	if err := h.do(ctx, "POST", MVHostBoot, "/servers", body, &out, 202); err != nil {
		return "", err
	}
	_, err := h.WaitServer(ctx, out.Server.ID, "ACTIVE", host)
	return out.Server.ID, err
}

// BootBFV makes n volumes from the image (multiattach=False) and boots a
// server from each on host, named prefix-0..n-1 (volumes prefix-0-vol..).
// It returns the server and volume ids in order (those made so far on error).
func (h *Harness) BootBFV(ctx context.Context, n int, host, prefix string) (servers, volumes []string, err error) {
	for i := range n {
		v, err := h.CreateVolumeFromImage(ctx, fmt.Sprintf("%s-%d-vol", prefix, i))
		if v != "" {
			volumes = append(volumes, v)
		}
		if err != nil {
			return servers, volumes, err
		}
		s, err := h.BootFromVolume(ctx, host, fmt.Sprintf("%s-%d", prefix, i), v)
		if s != "" {
			servers = append(servers, s)
		}
		if err != nil {
			return servers, volumes, err
		}
	}
	return servers, volumes, nil
}

// ServerVolumes lists the ids of the volumes Nova has attached to the
// server (os-extended-volumes:volumes_attached).
func (h *Harness) ServerVolumes(ctx context.Context, id string) ([]string, error) {
	var out struct {
		Server struct {
			Volumes []struct{ ID string } `json:"os-extended-volumes:volumes_attached"`
		} `json:"server"`
	}
	if err := h.do(ctx, "GET", "", "/servers/"+id, nil, &out, 200); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(out.Server.Volumes))
	for _, v := range out.Server.Volumes {
		ids = append(ids, v.ID)
	}
	return ids, nil
}

// DeleteVolumes deletes each volume (detached ones; 404 counts as gone) and
// waits until Cinder no longer lists it.
func (h *Harness) DeleteVolumes(ctx context.Context, ids ...string) error {
	c, err := h.BlockStorage(MVVolume)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		errs = append(errs, doOn(ctx, c, "DELETE", "/volumes/"+id, nil, nil, 202, 404))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, id := range ids {
		if err := poll(ctx, "volume "+id+" gone", func() (bool, error) {
			r, err := rawRequest(ctx, c, "GET", "/volumes/"+id, nil, nil)
			if err != nil {
				return false, err
			}
			return r.Status == http.StatusNotFound, nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// ServiceToken authenticates as the service user (clouds.yaml entry
// hvguard-service) and returns a fresh token id: the X-Service-Token value.
func (h *Harness) ServiceToken(ctx context.Context) (string, error) {
	ao, _, _, err := clouds.Parse(clouds.WithCloudName(ServiceCloudName),
		clouds.WithLocations(filepath.Join(h.WorkDir, "clouds.yaml")))
	if err != nil {
		return "", fmt.Errorf("clouds.yaml %s: %w", ServiceCloudName, err)
	}
	pc, err := config.NewProviderClient(ctx, ao)
	if err != nil {
		return "", fmt.Errorf("keystone auth as %s: %w", ServiceCloudName, err)
	}
	return pc.Token(), nil
}

// Masakari returns a client of masakari-api (service type instance-ha) at
// MVMasakari with the admin token.
func (h *Harness) Masakari() (*gophercloud.ServiceClient, error) {
	eo := h.Endpoints
	eo.ApplyDefaults("instance-ha")
	u, err := h.Provider.EndpointLocator(eo)
	if err != nil {
		return nil, fmt.Errorf("instance-ha endpoint (HVG_OS_MASAKARI=1 up.sh): %w", err)
	}
	c := &gophercloud.ServiceClient{ProviderClient: h.Provider, Endpoint: u, Type: "instance-ha",
		Microversion: MVMasakari}
	return c, nil
}

// MasakariRaw sends one request to masakari-api (path relative to
// /v1/{project}, e.g. "/notifications"); every status is an answer.
func (h *Harness) MasakariRaw(ctx context.Context, method, path string, body any) (*Response, error) {
	c, err := h.Masakari()
	if err != nil {
		return nil, err
	}
	return rawRequest(ctx, c, method, path, body, nil)
}

// MasakariHostNotification posts the COMPUTE_HOST notification
// masakari-hostmonitor sends for a dead host (event STOPPED, host_status
// NORMAL, cluster_status OFFLINE) with generated_time at, and returns its
// uuid. at is "2006-01-02T15:04:05" UTC.
func (h *Harness) MasakariHostNotification(ctx context.Context, host, at string) (string, error) {
	c, err := h.Masakari()
	if err != nil {
		return "", err
	}
	var out struct {
		Notification struct {
			UUID string `json:"notification_uuid"`
		} `json:"notification"`
	}
	body := map[string]any{"notification": map[string]any{
		"type": "COMPUTE_HOST", "hostname": host, "generated_time": at,
		"payload": map[string]any{"event": "STOPPED", "host_status": "NORMAL", "cluster_status": "OFFLINE"},
	}}
	err = doOn(ctx, c, "POST", "/notifications", body, &out, 202)
	return out.Notification.UUID, err
}

// MasakariNotificationStatus returns the notification's status (new,
// running, finished, failed, ignored, error).
func (h *Harness) MasakariNotificationStatus(ctx context.Context, id string) (string, error) {
	c, err := h.Masakari()
	if err != nil {
		return "", err
	}
	var out struct {
		Notification struct{ Status string } `json:"notification"`
	}
	err = doOn(ctx, c, "GET", "/notifications/"+id, nil, &out, 200)
	return out.Notification.Status, err
}

// MasakariMaintenance sets on_maintenance of host in the segment
// MasakariSegment: Masakari's engine puts a host it recovered into
// maintenance, and ignores notifications for a host in maintenance.
func (h *Harness) MasakariMaintenance(ctx context.Context, host string, on bool) error {
	c, err := h.Masakari()
	if err != nil {
		return err
	}
	var segs struct {
		Segments []struct{ UUID, Name string } `json:"segments"`
	}
	if err := doOn(ctx, c, "GET", "/segments", nil, &segs, 200); err != nil {
		return err
	}
	for _, s := range segs.Segments {
		if s.Name != MasakariSegment {
			continue
		}
		var hosts struct {
			Hosts []struct{ UUID, Name string } `json:"hosts"`
		}
		if err := doOn(ctx, c, "GET", "/segments/"+s.UUID+"/hosts", nil, &hosts, 200); err != nil {
			return err
		}
		for _, x := range hosts.Hosts {
			if x.Name == host {
				return doOn(ctx, c, "PUT", "/segments/"+s.UUID+"/hosts/"+x.UUID, map[string]any{"host": map[string]any{"on_maintenance": on}}, nil, 200)
			}
		}
	}
	return fmt.Errorf("no host %s in masakari segment %s", host, MasakariSegment)
}

// EnableCompute sets host's nova-compute service status to disabled and
// back to enabled (mv 2.53). Masakari disables the service of a host it
// recovers; Nova keeps the COMPUTE_STATUS_DISABLED trait in placement, and
// boots there get NoValidHost, until the service is re-enabled with its
// nova-compute up (shared/reference/openstack.md).
func (h *Harness) EnableCompute(ctx context.Context, host string) error {
	id, err := h.ComputeServiceID(ctx, host)
	if err != nil {
		return err
	}
	for _, st := range []string{"disabled", "enabled"} {
		if err := h.do(ctx, "PUT", MVForcedDown, "/os-services/"+id, map[string]any{"status": st}, nil, 200); err != nil {
			return err
		}
	}
	return nil
}
