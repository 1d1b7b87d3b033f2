package testkit

import (
	"strconv"
	"strings"
)

// Metric is the value of the first series named name in a Prometheus text exposition whose
// labels include every one of labels (each written `k="v"`), or false when there is none.
func Metric(exposition, name string, labels ...string) (float64, bool) {
next:
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			return v, true
		}
	}
	return 0, false
}
