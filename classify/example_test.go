package classify_test

import (
	"fmt"
	"time"

	"hvguard/classify"
)

// The agent's use: a stop confirmed by the debouncer goes to Add instead of
// being published; queries run off the loop and come back as results; a
// report is published with its classification.
func Example() {
	c, _ := classify.New(classify.Config{})
	began := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	now := began.Add(15 * time.Second) // the debouncer's window ended, domain off

	for _, d := range c.Add(classify.Stop{UUID: "u1", Detail: classify.ParseDetail("DESTROYED"), Began: began}, now) {
		fmt.Println(d) // query-servers: the caller lists servers on the host
	}
	// Nova is hard-rebooting it: held.
	rebooting := []classify.Server{{UUID: "u1", VMState: classify.VMActive, TaskState: classify.TaskRebootStartedHard, PowerState: classify.PowerRunning}}
	for _, d := range c.ServersResult(1, rebooting, nil, now.Add(200*time.Millisecond)) {
		fmt.Println(d)
	}
	// libvirt: the domain runs again (RESUMED/STARTED).
	for _, d := range c.Alive("u1", now.Add(20*time.Second)) {
		fmt.Println(d, "after", d.Held)
	}
	// Output:
	// query-servers
	// hold operation-in-flight detail=destroyed task=reboot_started_hard vm=active
	// report rebooted started-during-operation detail=destroyed task=reboot_started_hard vm=active after 20s
}
