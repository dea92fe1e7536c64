package openstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/utils"

	"hvguard/reconcile"
)

// Strict decoders of the recovery answers (decode.go's rules: a required
// field missing, null, of another type, a duplicate key or trailing data is
// an error; unknown fields are ignored).

// reqBool returns the boolean field key (present, not null).
func reqBool(o map[string]json.RawMessage, key string) (bool, error) {
	raw, ok := o[key]
	if !ok {
		return false, fmt.Errorf("field %q missing", key)
	}
	var b bool
	if isNull(raw) || json.Unmarshal(raw, &b) != nil {
		return false, fmt.Errorf("field %q: want a boolean, got %s", key, kindOf(raw))
	}
	return b, nil
}

// optTime returns the time field key (present; zero when null or "").
func optTime(o map[string]json.RawMessage, key string) (time.Time, error) {
	s, err := optString(o, key)
	if err != nil || s == "" {
		return time.Time{}, err
	}
	t, err := novaTime(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", key, err)
	}
	return t, nil
}

// strField is a string field to read: required (non-null) or optional
// (null → "").
type strField struct {
	key string
	dst *string
	opt bool
}

// readStrings reads each field of fs from o (reqString or optString).
func readStrings(o map[string]json.RawMessage, fs ...strField) error {
	for _, f := range fs {
		var err error
		if f.opt {
			*f.dst, err = optString(o, f.key)
		} else {
			*f.dst, err = reqString(o, f.key)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// member returns the object under key of a top-level object body.
func member(body []byte, key string) (map[string]json.RawMessage, error) {
	top, err := object(body)
	if err != nil {
		return nil, err
	}
	raw, ok := top[key]
	if !ok {
		return nil, fmt.Errorf("field %q missing", key)
	}
	o, err := object(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return o, nil
}

// array returns the items of the array field key.
func array(o map[string]json.RawMessage, key string) ([]json.RawMessage, error) {
	raw, ok := o[key]
	if !ok {
		return nil, fmt.Errorf("field %q missing", key)
	}
	var items []json.RawMessage
	if isNull(raw) || json.Unmarshal(raw, &items) != nil {
		return nil, fmt.Errorf("field %q: want an array, got %s", key, kindOf(raw))
	}
	return items, nil
}

// decodeServices decodes a GET /os-services body at ServicesMicroversion.
func decodeServices(body []byte) ([]Service, error) {
	top, err := object(body)
	if err != nil {
		return nil, err
	}
	items, err := array(top, "services")
	if err != nil {
		return nil, err
	}
	out := make([]Service, 0, len(items))
	for i, it := range items {
		o, err := object(it)
		if err != nil {
			return nil, fmt.Errorf("service %d: %w", i, err)
		}
		s, err := decodeService(o)
		if err != nil {
			return nil, fmt.Errorf("service %d: %w", i, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// decodeServiceUpdate decodes a PUT /os-services/{id} body.
func decodeServiceUpdate(body []byte) (Service, error) {
	o, err := member(body, "service")
	if err != nil {
		return Service{}, err
	}
	return decodeService(o)
}

// decodeService decodes one nova-compute service record at 2.53.
func decodeService(o map[string]json.RawMessage) (Service, error) {
	var s Service
	var binary string
	var err error
	if err = readStrings(o, strField{"id", &s.ID, false}, strField{"binary", &binary, false}, strField{"host", &s.Host, false},
		strField{"zone", &s.Zone, true}, strField{"status", &s.Status, false}, strField{"state", &s.State, false},
		strField{"disabled_reason", &s.DisabledReason, true}); err != nil {
		return s, err
	}
	s.ID = strings.ToLower(s.ID)
	switch {
	case !reconcile.ValidUUID(s.ID):
		return s, fmt.Errorf("id %q is not a UUID (an answer below microversion %s?)", s.ID, ServicesMicroversion)
	case binary != "nova-compute":
		return s, fmt.Errorf("binary %q, asked for nova-compute", binary)
	case s.Status != "enabled" && s.Status != "disabled":
		return s, fmt.Errorf("status %q: want enabled or disabled", s.Status)
	case s.State != "up" && s.State != "down":
		return s, fmt.Errorf("state %q: want up or down", s.State)
	}
	if s.ForcedDown, err = reqBool(o, "forced_down"); err != nil {
		return s, err
	}
	if s.UpdatedAt, err = optTime(o, "updated_at"); err != nil {
		return s, err
	}
	return s, nil
}

// decodeServer2 decodes one server (GET /servers/{id}'s "server" or an
// item of /servers/detail) at Microversion into a Server.
func decodeServer2(raw json.RawMessage) (Server, error) {
	var s Server
	o, err := object(raw)
	if err != nil {
		return s, err
	}
	st, err := decodeServerState(raw)
	if err != nil {
		return s, err
	}
	s.ID, s.Status, s.VMState, s.TaskState, s.PowerState, s.Host = st.ID, st.Status, st.VMState, st.TaskState, st.PowerState, st.Host
	if s.Name, err = reqString(o, "name"); err != nil {
		return s, err
	}
	if s.ProjectID, err = reqString(o, "tenant_id"); err != nil {
		return s, err
	}
	mraw, ok := o["metadata"]
	if !ok {
		return s, errors.New(`field "metadata" missing`)
	}
	if isNull(mraw) || json.Unmarshal(mraw, &s.Metadata) != nil {
		return s, fmt.Errorf(`field "metadata": want an object of strings, got %s`, trimBody(mraw))
	}
	if _, err := object(mraw); err != nil {
		return s, fmt.Errorf("metadata: %w", err)
	}
	vols, err := array(o, "os-extended-volumes:volumes_attached")
	if err != nil {
		return s, err
	}
	for i, v := range vols {
		vo, err := object(v)
		if err != nil {
			return s, fmt.Errorf("volumes_attached %d: %w", i, err)
		}
		id, err := reqString(vo, "id")
		if err != nil {
			return s, fmt.Errorf("volumes_attached %d: %w", i, err)
		}
		id = strings.ToLower(id)
		if !reconcile.ValidUUID(id) {
			return s, fmt.Errorf("volumes_attached %d: id %q is not a UUID", i, id)
		}
		s.Volumes = append(s.Volumes, id)
	}
	// image: "" for a server booted from a volume, else {"id": …, "links": …}.
	iraw, ok := o["image"]
	if !ok {
		return s, errors.New(`field "image" missing`)
	}
	var img string
	switch {
	case json.Unmarshal(iraw, &img) == nil && !isNull(iraw):
		if img != "" {
			return s, fmt.Errorf(`field "image": the string %q (Nova writes "" for a volume-backed server or an object)`, img)
		}
		s.BootFromVolume = true
	default:
		imgObj, err := object(iraw)
		if err != nil {
			return s, fmt.Errorf(`field "image": want "" or an object: %w`, err)
		}
		if _, err := reqString(imgObj, "id"); err != nil {
			return s, fmt.Errorf("image: %w", err)
		}
	}
	if s.BootFromVolume && len(s.Volumes) == 0 {
		return s, errors.New("no image and no attached volume")
	}
	return s, nil
}

// decodeVolume decodes a GET /volumes/{id} body for volume id.
func decodeVolume(body []byte, id string) (Volume, error) {
	var v Volume
	o, err := member(body, "volume")
	if err != nil {
		return v, err
	}
	if v.ID, err = reqString(o, "id"); err != nil {
		return v, err
	}
	v.ID = strings.ToLower(v.ID)
	if v.ID != strings.ToLower(id) {
		return v, fmt.Errorf("asked for volume %s, got %s", id, v.ID)
	}
	if v.Status, err = reqString(o, "status"); err != nil {
		return v, err
	}
	if v.Status == "" {
		return v, errors.New("status is empty")
	}
	if v.Multiattach, err = reqBool(o, "multiattach"); err != nil {
		return v, err
	}
	items, err := array(o, "attachments")
	if err != nil {
		return v, err
	}
	seen := map[string]bool{}
	for i, it := range items {
		a, err := decodeVolumeAttachment(it, v.ID)
		if err != nil {
			return v, fmt.Errorf("attachment %d: %w", i, err)
		}
		if seen[a.ID] {
			return v, fmt.Errorf("attachment %s listed twice", a.ID)
		}
		seen[a.ID] = true
		v.Attachments = append(v.Attachments, a)
	}
	return v, nil
}

// decodeVolumeAttachment decodes one item of a volume's attachments.
func decodeVolumeAttachment(raw []byte, volumeID string) (Attachment, error) {
	var a Attachment
	o, err := object(raw)
	if err != nil {
		return a, err
	}
	var vol string
	if err = readStrings(o, strField{"attachment_id", &a.ID, false}, strField{"volume_id", &vol, false},
		strField{"server_id", &a.ServerID, true}, strField{"host_name", &a.Host, true}, strField{"device", &a.Device, true}); err != nil {
		return a, err
	}
	a.ID, a.ServerID = strings.ToLower(a.ID), strings.ToLower(a.ServerID)
	switch {
	case !reconcile.ValidUUID(a.ID):
		return a, fmt.Errorf("attachment_id %q is not a UUID", a.ID)
	case !strings.EqualFold(vol, volumeID):
		return a, fmt.Errorf("volume_id %q, not the volume %s", vol, volumeID)
	case a.ServerID != "" && !reconcile.ValidUUID(a.ServerID):
		return a, fmt.Errorf("server_id %q is not a UUID", a.ServerID)
	}
	if a.AttachedAt, err = optTime(o, "attached_at"); err != nil {
		return a, err
	}
	return a, nil
}

// decodeAttachmentStatus decodes a GET /attachments/{id} body for
// attachment id and returns its status.
func decodeAttachmentStatus(body []byte, id string) (string, error) {
	o, err := member(body, "attachment")
	if err != nil {
		return "", err
	}
	got, err := reqString(o, "id")
	if err != nil {
		return "", err
	}
	if !strings.EqualFold(got, id) {
		return "", fmt.Errorf("asked for attachment %s, got %s", id, got)
	}
	st, err := reqString(o, "status")
	if err != nil {
		return "", err
	}
	if st == "" {
		return "", errors.New("status is empty")
	}
	return st, nil
}

// decodeNotification decodes a Masakari {"notification": {…}} body.
func decodeNotification(body []byte) (MasakariNotification, error) {
	o, err := member(body, "notification")
	if err != nil {
		return MasakariNotification{}, err
	}
	return decodeNotificationObject(o)
}

// decodeNotifications decodes a Masakari {"notifications": […]} body.
func decodeNotifications(body []byte) ([]MasakariNotification, error) {
	top, err := object(body)
	if err != nil {
		return nil, err
	}
	items, err := array(top, "notifications")
	if err != nil {
		return nil, err
	}
	out := make([]MasakariNotification, 0, len(items))
	for i, it := range items {
		o, err := object(it)
		if err == nil {
			var n MasakariNotification
			if n, err = decodeNotificationObject(o); err == nil {
				out = append(out, n)
				continue
			}
		}
		return nil, fmt.Errorf("notification %d: %w", i, err)
	}
	return out, nil
}

// decodeNotificationObject decodes one notification.
func decodeNotificationObject(o map[string]json.RawMessage) (MasakariNotification, error) {
	var n MasakariNotification
	var err error
	var gen string
	if err = readStrings(o, strField{"notification_uuid", &n.ID, false}, strField{"type", &n.Type, false},
		strField{"status", &n.Status, false}, strField{"generated_time", &gen, false}); err != nil {
		return n, err
	}
	n.ID = strings.ToLower(n.ID)
	if !reconcile.ValidUUID(n.ID) {
		return n, fmt.Errorf("notification_uuid %q is not a UUID", n.ID)
	}
	switch n.Status {
	case NotificationNew, NotificationRunning, NotificationError, NotificationFailed, NotificationIgnored, NotificationFinished:
	default:
		return n, fmt.Errorf("status %q is not a Masakari notification status", n.Status)
	}
	if n.GeneratedTime, err = novaTime(gen); err != nil {
		return n, fmt.Errorf("generated_time: %w", err)
	}
	praw, ok := o["payload"]
	if !ok {
		return n, errors.New(`field "payload" missing`)
	}
	if _, err := object(praw); err != nil || json.Unmarshal(praw, &n.Payload) != nil {
		return n, fmt.Errorf(`field "payload": want an object of strings, got %s`, trimBody(praw))
	}
	return n, nil
}

// decodeVersionDocument decodes Nova's versioned endpoint document
// ({"version": {"id": "v2.1", "version": "2.93", "min_version": "2.1", …}}).
func decodeVersionDocument(body []byte) (utils.SupportedMicroversions, error) {
	var sup utils.SupportedMicroversions
	o, err := member(body, "version")
	if err != nil {
		return sup, err
	}
	maxV, err := reqString(o, "version")
	if err != nil {
		return sup, err
	}
	minV, err := reqString(o, "min_version")
	if err != nil {
		return sup, err
	}
	if sup.MaxMajor, sup.MaxMinor, err = utils.ParseMicroversion(maxV); err != nil {
		return sup, fmt.Errorf("version %q: %w", maxV, err)
	}
	if sup.MinMajor, sup.MinMinor, err = utils.ParseMicroversion(minV); err != nil {
		return sup, fmt.Errorf("min_version %q: %w", minV, err)
	}
	if sup.MinMajor > sup.MaxMajor || (sup.MinMajor == sup.MaxMajor && sup.MinMinor > sup.MaxMinor) {
		return sup, fmt.Errorf("min_version %s above version %s", minV, maxV)
	}
	return sup, nil
}
