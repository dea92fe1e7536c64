package reconcile

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// NovaNamespace is the XML namespace of the metadata Nova writes into every
// domain it defines (<nova:instance xmlns:nova="...">).
const NovaNamespace = "http://openstack.org/xmlns/libvirt/nova/1.1"

// MarkNamespace and MarkKey name hvguard's own metadata element, written
// into a domain this package destroyed (or found already off) as a stale
// copy of an evacuated instance. `virsh metadata <dom> --uri MarkNamespace`
// shows it.
const (
	MarkNamespace = "https://hvguard.dev/xmlns/reconcile/1"
	MarkKey       = "hvguard"
)

// maxMetadataBytes bounds the metadata parsed. Nova's element is well under
// 4 KiB (flavor, owner, ports); anything far larger is not Nova's.
const maxMetadataBytes = 64 << 10

// NovaInstanceInfo is what hvguard reads from Nova's domain metadata.
type NovaInstanceInfo struct {
	Name string // <name>: the server's display name
}

// ParseNovaMetadata checks that s (the metadata libvirt returns for
// NovaNamespace) is one well-formed <instance> element, as Nova writes it.
// libvirt returns the element without its namespace prefix, so the root's
// local name is what is checked; the namespace itself was selected by the
// libvirt call.
func ParseNovaMetadata(s string) (NovaInstanceInfo, error) {
	var info NovaInstanceInfo
	if len(s) > maxMetadataBytes {
		return info, fmt.Errorf("reconcile: nova metadata is %d bytes (limit %d)", len(s), maxMetadataBytes)
	}
	dec := xml.NewDecoder(strings.NewReader(s))
	depth := 0
	var root string
	inName := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return info, fmt.Errorf("reconcile: nova metadata: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				if root != "" {
					return info, errors.New("reconcile: nova metadata has more than one root element")
				}
				root = t.Name.Local
			}
			depth++
			inName = depth == 2 && t.Name.Local == "name"
		case xml.EndElement:
			depth--
			inName = false
		case xml.CharData:
			if depth == 0 && len(bytes.TrimSpace(t)) > 0 {
				return info, errors.New("reconcile: nova metadata has text outside its element")
			}
			if inName {
				info.Name += string(t)
			}
		}
	}
	if root != "instance" {
		return info, fmt.Errorf("reconcile: nova metadata root is %q, not instance", root)
	}
	return info, nil
}

// Mark is hvguard's record, in the domain's metadata, of why it powered
// the domain off. Attribute names are stable (schema 1).
type Mark struct {
	XMLName         xml.Name  `xml:"reconcile"`
	Reason          Reason    `xml:"reason,attr"`
	Action          Outcome   `xml:"action,attr"`
	At              time.Time `xml:"at,attr"`
	MigrationID     int64     `xml:"migration-id,attr"`
	MigrationUUID   string    `xml:"migration-uuid,attr,omitempty"`
	MigrationStatus string    `xml:"migration-status,attr"`
	SourceCompute   string    `xml:"source-compute,attr"`
	DestCompute     string    `xml:"dest-compute,attr"`
	DestHost        string    `xml:"dest-host,attr,omitempty"`
	ServerHost      string    `xml:"server-host,attr"`
}

// MarkXML renders m as the single element SetMetadata expects (no
// namespace prefix: libvirt adds MarkKey and MarkNamespace).
func MarkXML(m Mark) (string, error) {
	b, err := xml.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("reconcile: mark: %w", err)
	}
	return string(b), nil
}

// ParseMark decodes a mark read back with Metadata(uuid, MarkNamespace).
func ParseMark(s string) (Mark, error) {
	var m Mark
	if len(s) > maxMetadataBytes {
		return m, fmt.Errorf("reconcile: mark is %d bytes (limit %d)", len(s), maxMetadataBytes)
	}
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return m, fmt.Errorf("reconcile: mark: %w", err)
	}
	return m, nil
}

func markFrom(dd DomainDecision, outcome Outcome, at time.Time) Mark {
	m := Mark{Reason: dd.Reason, Action: outcome, At: at.UTC()}
	if ev := dd.Evidence; ev != nil {
		m.MigrationID, m.MigrationUUID, m.MigrationStatus = ev.MigrationID, ev.MigrationUUID, ev.MigrationStatus
		m.SourceCompute, m.DestCompute, m.DestHost, m.ServerHost = ev.SourceCompute, ev.DestCompute, ev.DestHost, ev.ServerHost
	}
	return m
}
