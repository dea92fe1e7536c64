package fencing

// DurableSource names the copy of the durable state a start uses.
type DurableSource string

// Durable state sources (ChooseDurable).
const (
	DurableNone    DurableSource = "none"    // neither copy usable: a first start
	DurableState   DurableSource = "state"   // state_dir/fence.json
	DurableRuntime DurableSource = "runtime" // the per-boot runtime copy
)

// ChooseDurable picks the durable state a start restores from two copies
// written together: state (state_dir, kept across boots; nil when missing
// or unreadable) and runtime (a per-boot directory on tmpfs, e.g.
// /run/hvguard; nil likewise). The runtime copy counts only when it was
// written in this boot (bootID): it exists so that a state_dir lost
// within the boot (deleted, corrupt) keeps the lease age and the fence
// state — without it the start is a first start, whose assumed lease age
// of one interval may feed the watchdog past the real lease. Across a
// reboot it is gone anyway, and the reboot stopped the domains. Of two
// usable copies the newer one (Durable.Writes; a state_dir copy of an
// earlier boot is older) wins; on a tie, state.
func ChooseDurable(state, runtime *Durable, bootID string) (*Durable, DurableSource) {
	if runtime == nil || runtime.BootID != bootID || Mutations.RuntimeCopyIgnored {
		if state == nil {
			return nil, DurableNone
		}
		return state, DurableState
	}
	// Writes orders the copies of one process's lineage only; a release
	// before the runtime copy (rolled back to, then upgraded again within
	// the boot) writes neither Writes nor the copy, so a state_dir copy of
	// a newer incarnation wins whatever the counts say.
	if state == nil || state.BootID != bootID || runtime.Incarnation >= state.Incarnation && runtime.Writes > state.Writes {
		return runtime, DurableRuntime
	}
	return state, DurableState
}
