package doccheck

import (
	"slices"
	"testing"
)

func TestHelpFlags(t *testing.T) {
	help := "usage: x\n\nAPI:\n  -listen string\n    \taddress\n  -no-events\n    \toff\n  -x.y int\n"
	if got := HelpFlags(help); !slices.Equal(got, []string{"listen", "no-events", "x.y"}) {
		t.Errorf("got %v", got)
	}
}

func TestAttributed(t *testing.T) {
	doc := "# T\n\n```\nkvbench replay --kvrouter bin/kvrouter --speed 2 --trace t\n```\n\n" +
		"```sh\nkvrouter --listen :8000 \\\n  --engine 'a=http://h;events=tcp://h:1' | tee log\n" +
		"./bin/kvrouter --policy kv # --not-this\n```\n\n" +
		"| flag | meaning |\n|---|---|\n| `--config F`, `--admin-listen` | x |\n| `--log-format text\\|json`, `--log-level` | y |\n\n" +
		"Prose: `kvrouter --model m` and `vllm-sim --port 1`, kvrouter's --ignored.\n\n## Other\n\n" +
		"```\nvllm-sim --port 1\nkvrouter --xy\n```\n\n| flag | meaning |\n|---|---|\n| `--mixed` | two commands above |\n"
	var got []string
	for _, m := range Attributed([]docFile{{"d.md", doc}}, "kvrouter") {
		got = append(got, m.Flag)
	}
	want := []string{"listen", "engine", "policy", "config", "admin-listen", "log-format", "log-level", "model", "xy"}
	if !slices.Equal(got, want) {
		t.Errorf("kvrouter: got %v, want %v", got, want)
	}
	got = nil
	for _, m := range Attributed([]docFile{{"d.md", doc}}, "kvbench replay") {
		got = append(got, m.Flag)
	}
	if want := []string{"kvrouter", "speed", "trace"}; !slices.Equal(got, want) {
		t.Errorf("kvbench replay: got %v, want %v", got, want)
	}
}
