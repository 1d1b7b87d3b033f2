package replay

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// MaxHostCPU is the host CPU share above which a run is invalid: past it the engines' simulated
// time and the router compete for cores, and latency measures the machine, not the policy.
const MaxHostCPU = 0.60

// clockTicks is USER_HZ, the unit of /proc's CPU times (100 on every Linux architecture Go runs on).
const clockTicks = 100

// CPUUse is what a run cost the machine, as shares of all its cores over the run's wall time.
type CPUUse struct {
	// Host is the busy share of every core (all processes, from /proc/stat).
	Host float64 `json:"host_cpu"`
	// Replay is the share the run's own processes (engines and router) took.
	Replay float64 `json:"replay_cpu"`
	// Invalid is set when Host is over MaxHostCPU.
	Invalid bool `json:"invalid,omitempty"`
}

// cpuSnapshot is the host's busy and total ticks and the run processes' ticks at one moment.
type cpuSnapshot struct {
	busy, total, procs uint64
}

// parseHostStat reads the aggregate "cpu" line of /proc/stat: busy = total − idle − iowait.
func parseHostStat(stat string) (busy, total uint64, err error) {
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		var v []uint64
		for _, s := range f[1:] {
			x, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc/stat: %w", err)
			}
			v = append(v, x)
		}
		// user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
		for i, x := range v {
			if i < 8 {
				total += x
			}
		}
		idle := v[3]
		if len(v) > 4 {
			idle += v[4]
		}
		return total - idle, total, nil
	}
	return 0, 0, errors.New("/proc/stat: no cpu line")
}

// parseProcStat reads utime + stime from /proc/PID/stat (fields 14 and 15; the command name in
// parentheses may hold spaces, so fields are counted after its closing parenthesis).
func parseProcStat(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc/PID/stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime 15.
	if len(f) < 13 {
		return 0, errors.New("/proc/PID/stat: too few fields")
	}
	u, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	s, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, err
	}
	return u + s, nil
}

// snapshotCPU reads the host's ticks and the given processes' (a process that already exited
// counts 0: its time is lost, which under-reports and never invalidates a run wrongly).
func snapshotCPU(pids []int) (cpuSnapshot, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSnapshot{}, err
	}
	var s cpuSnapshot
	if s.busy, s.total, err = parseHostStat(string(b)); err != nil {
		return s, err
	}
	for _, pid := range pids {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if t, err := parseProcStat(string(b)); err == nil {
				s.procs += t
			}
		}
	}
	return s, nil
}

// cpuUse turns two snapshots wallSeconds apart on a machine of cores cores into shares.
func cpuUse(a, b cpuSnapshot, wallSeconds float64, cores int) CPUUse {
	var u CPUUse
	if b.total > a.total {
		u.Host = float64(b.busy-a.busy) / float64(b.total-a.total)
	}
	if wallSeconds > 0 && cores > 0 && b.procs >= a.procs {
		u.Replay = float64(b.procs-a.procs) / clockTicks / wallSeconds / float64(cores)
	}
	u.Invalid = u.Host > MaxHostCPU
	return u
}

// numCPU is the cores the shares are taken over.
func numCPU() int { return runtime.NumCPU() }
