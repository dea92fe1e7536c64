package libvirtx

import (
	"fmt"
	"strings"
)

// TestDomainXML returns a minimal domain definition that libvirt's test
// driver accepts (type 'test'), for tests and the demo. name is XML-escaped.
func TestDomainXML(name, uuid string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")
	return fmt.Sprintf(`<domain type='test'>
  <name>%s</name>
  <uuid>%s</uuid>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64'>hvm</type>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
</domain>
`, r.Replace(name), r.Replace(uuid))
}
