package index

import "fmt"

// Tier is where a replica holds a block. Lower is faster.
type Tier uint8

const (
	GPU Tier = iota
	CPU
	Disk
	// NumTiers is the number of tiers; Tier values are below it.
	NumTiers = 3
)

func (t Tier) String() string {
	switch t {
	case GPU:
		return "GPU"
	case CPU:
		return "CPU"
	case Disk:
		return "Disk"
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

func (t Tier) valid() bool { return t < NumTiers }

// ParseMedium maps a KV event's medium to a tier. "" (a nil medium: engines before v0.10.2
// had only the GPU pool) and "GPU" are GPU, "CPU" is CPU, "STORAGE" and "DISK" are Disk. Any
// other medium maps to Disk, the slowest tier, with known=false (see the package doc). The
// ingester routes on ParseResidency, which also tells shared storage from the replica's own.
func ParseMedium(medium string) (t Tier, known bool) {
	switch medium {
	case "", "GPU", "gpu":
		return GPU, true
	case "CPU", "cpu":
		return CPU, true
	case "STORAGE", "DISK", "storage", "disk":
		return Disk, true
	}
	return Disk, false
}

// Residency is whose cache a block copy is, as far as routing goes.
type Residency uint8

const (
	// Own: the replica itself holds the copy (GPU, CPU or local disk): a request routed there
	// reuses it.
	Own Residency = iota
	// Shared: the copy sits in storage the engine reaches but does not hold (locality REMOTE, or
	// a shared storage medium: FS, OBJ, STORAGE). Any replica attached to that storage could
	// load it, so it says nothing about this replica; it is counted and shown, never routed on.
	Shared
	// Unknown: a medium or locality this version does not know; the event is skipped and counted
	// (failing closed: a new medium is certainly not GPU memory).
	Unknown
)

// ParseResidency classifies a KV event's medium and locality. vLLM's contract
// (tests/v1/core/test_kv_events_contract.py at commit a0db8d8a0eb8, and docs/features/kv_events.md)
// counts copies per (medium, group, locality, ownership, hash); locality is "LOCAL" or "REMOTE"
// (#48281; absent means LOCAL), and the offload media FS and OBJ (#47923) and STORAGE (#48123)
// name storage shared beyond the engine. "" and "GPU" are the GPU pool, "CPU" host memory,
// "DISK" a replica-local disk tier. The tier is the one a Shared copy would be filed under if
// it were local (Disk), for display.
func ParseResidency(medium, locality string) (Tier, Residency) {
	var t Tier
	res := Own
	switch medium {
	case "", "GPU", "gpu":
		t = GPU
	case "CPU", "cpu":
		t = CPU
	case "DISK", "disk":
		t = Disk
	case "STORAGE", "storage", "FS", "fs", "OBJ", "obj":
		t, res = Disk, Shared
	default:
		return Disk, Unknown
	}
	switch locality {
	case "", "LOCAL", "local":
	case "REMOTE", "remote":
		res = Shared
	default:
		return t, Unknown
	}
	return t, res
}
