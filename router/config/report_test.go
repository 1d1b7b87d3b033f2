package config

import (
	"strings"
	"testing"
)

func TestServedModelReportModeAndReport(t *testing.T) {
	c, err := Parse([]byte("servedModelName: qwen\nkvCacheReportMode: full\nreport: {namespace: ns, kvRoutedModel: m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ServedModelName != "qwen" || c.KVCacheReportMode != "full" || c.Report == nil || c.Report.KVRoutedModel != "m" {
		t.Fatalf("%+v", c)
	}
	for in, want := range map[string]string{
		"kvCacheReportMode: fulll\n": "kvCacheReportMode",
		"report: {namespace: ns}\n":  "report",
	} {
		if _, err := Parse([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %s", in, err, want)
		}
	}
}
