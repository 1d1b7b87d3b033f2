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
// other medium maps to Disk, the slowest tier, with known=false (see the package doc).
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
