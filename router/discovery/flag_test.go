package discovery

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/engine"
)

func TestParseEngineFlagGood(t *testing.T) {
	warm := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	cases := []struct {
		in   string
		want Engine
	}{
		{"e0=http://10.0.0.5:8000", Engine{Name: "e0", URL: "http://10.0.0.5:8000", Ready: true}},
		{"e0=http://10.0.0.5:8000/", Engine{Name: "e0", URL: "http://10.0.0.5:8000", Ready: true}},
		{"e0=https://engine.example", Engine{Name: "e0", URL: "https://engine.example", Ready: true}},
		{" a.b-c_1 = http://h:1 ; ", Engine{Name: "a.b-c_1", URL: "http://h:1", Ready: true}},
		{"e1=http://h:8000;events=tcp://h:5557,tcp://h:5558;replay=tcp://h:5600,tcp://h:5601",
			Engine{Name: "e1", URL: "http://h:8000", Ready: true,
				Events: []string{"tcp://h:5557", "tcp://h:5558"}, Replay: []string{"tcp://h:5600", "tcp://h:5601"}}},
		{"e2=http://[fd00::1]:8000;events=tcp://[fd00::1]:5557",
			Engine{Name: "e2", URL: "http://[fd00::1]:8000", Ready: true, Events: []string{"tcp://[fd00::1]:5557"}}},
		{"e3=http://h:8000;warmup-until=2026-03-04T05:06:07Z;events=tcp://h:1;block-size=16",
			Engine{Name: "e3", URL: "http://h:8000", Ready: true, Events: []string{"tcp://h:1"}, WarmupUntil: warm, BlockSize: 16}},
		{"e4=http://h:8000;warmup-until=2026-03-04T06:06:07.5+01:00",
			Engine{Name: "e4", URL: "http://h:8000", Ready: true, WarmupUntil: warm.Add(500 * time.Millisecond)}},
		// Bound mode: events come in over the router's socket; replay is still the engine's.
		{"e5=http://h:8000;replay=tcp://h:5600,tcp://h:5601",
			Engine{Name: "e5", URL: "http://h:8000", Ready: true, Replay: []string{"tcp://h:5600", "tcp://h:5601"}}},
		{"e6=http://h:8000;snapshot=tcp://h:5700,tcp://h:5701;events=tcp://h:5557,tcp://h:5558;replay=tcp://h:5600,tcp://h:5601",
			Engine{Name: "e6", URL: "http://h:8000", Ready: true, Events: []string{"tcp://h:5557", "tcp://h:5558"},
				Replay: []string{"tcp://h:5600", "tcp://h:5601"}, Snapshot: []string{"tcp://h:5700", "tcp://h:5701"}}},
		{"e7=http://h:8000;events=tcp://h:5557;snapshot=tcp://h:5700",
			Engine{Name: "e7", URL: "http://h:8000", Ready: true, Events: []string{"tcp://h:5557"}, Snapshot: []string{"tcp://h:5700"}}},
		{"e8=http://h:8000;kind=SGLang;events=tcp://h:5557",
			Engine{Name: "e8", URL: "http://h:8000", Ready: true, Events: []string{"tcp://h:5557"}, Kind: engine.SGLang}},
		{"p0=http://h:8000;role=prefill", Engine{Name: "p0", URL: "http://h:8000", Ready: true, Role: "prefill"}},
		{"d0=http://h:8000;role=decode;events=tcp://h:5557",
			Engine{Name: "d0", URL: "http://h:8000", Ready: true, Events: []string{"tcp://h:5557"}, Role: "decode"}},
	}
	for _, tc := range cases {
		got, err := ParseEngineFlag(tc.in)
		if err != nil {
			t.Errorf("ParseEngineFlag(%q): %v", tc.in, err)
			continue
		}
		if !got.Equal(tc.want) {
			t.Errorf("ParseEngineFlag(%q) = %s, want %s", tc.in, show(got), show(tc.want))
		}
		back, err := ParseEngineFlag(got.String())
		if err != nil || !back.Equal(got) {
			t.Errorf("round trip of %q through %q: %s, %v", tc.in, got.String(), show(back), err)
		}
	}
}

func TestParseEngineFlagBad(t *testing.T) {
	cases := []struct{ in, wantErr string }{
		{"e=http://h:8000;kind=tgi", `kind "tgi" is not one of vllm, sglang, trtllm`},
		{"e=http://h:8000;kind=", `kind "" is not one of`},
		{"e=http://h:8000;role=both", `role "both" is not prefill or decode`},
		{"", "want NAME=http"},
		{"http://h:8000", "want NAME=http"},
		{"=http://h:8000", "name before '=' is empty"},
		{"a b=http://h:8000", "may not contain spaces"},
		{"a/b=http://h:8000", "contains '/'"},
		{"e=h:8000", "not http:// or https://"},
		{"e=ftp://h:8000", "not http:// or https://"},
		{"e=http://:8000", "has no host"},
		{"e=http://h:99999", "not in 1..65535"},
		{"e=http://h:8000/v1", "no path"},
		{"e=http://h:8000?x=1", "no path, query"},
		{"e=http://h:8000;events=", "lists no endpoints"},
		{"e=http://h:8000;events=h:5557", "rank 0"},
		{"e=http://h:8000;events=tcp://h:5557,udp://h:5558", "events rank 1"},
		{"e=http://h:8000;events=tcp://*:5557", "no host to connect to"},
		{"e=http://h:8000;events=tcp://h", "not in 1..65535"},
		{"e=http://h:8000;events=tcp://h:0", "not in 1..65535"},
		{"e=http://h:8000;events=tcp://h:1/x", "tcp://HOST:PORT only"},
		{"e=http://h:8000;events=tcp://h:1,tcp://h:2;replay=tcp://h:3", "replay has 1 endpoints but events has 2"},
		{"e=http://h:8000;events=tcp://h:1;events=tcp://h:2", "events is given twice"},
		{"e=http://h:8000;events=tcp://h:1,tcp://h:2;snapshot=tcp://h:3", "snapshot has 1 endpoints but events has 2"},
		{"e=http://h:8000;replay=tcp://h:1;snapshot=tcp://h:3,tcp://h:4", "snapshot has 2 endpoints but replay has 1"},
		{"e=http://h:8000;snapshot=", "snapshot= lists no endpoints"},
		{"e=http://h:8000;snapshot=tcp://h:1,h:2", "snapshot rank 1"},
		{"e=http://h:8000;warmup-until=tomorrow", "not an RFC 3339 time"},
		{"e=http://h:8000;warmup-until=2026-03-04 05:06:07", "not an RFC 3339 time"},
		{"e=http://h:8000;block-size=0", "block-size \"0\""},
		{"e=http://h:8000;block-size=x", "block-size \"x\""},
		{"e=http://h:8000;evnts=tcp://h:1", "unknown key \"evnts\""},
		{"e=http://h:8000;tcp://h:1", "is not key=value"},
	}
	for _, tc := range cases {
		_, err := ParseEngineFlag(tc.in)
		if err == nil {
			t.Errorf("ParseEngineFlag(%q) accepted", tc.in)
			continue
		}
		if !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ParseEngineFlag(%q) = %q, want it to mention %q", tc.in, err, tc.wantErr)
		}
	}
}

func FuzzParseEngineFlag(f *testing.F) {
	for _, s := range []string{"e=http://h:8000", "e1=http://h:8000;events=tcp://h:5557,tcp://h:5558;replay=tcp://h:5600,tcp://h:5601",
		"e=http://h:8000;events=tcp://h:1;snapshot=tcp://h:2", "e=http://[::1]:1;warmup-until=2026-03-04T05:06:07.123+02:00;block-size=16", ";;=", "e=http://h:8000;events=tcp://[::1]:5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEngineFlag(s)
		if err != nil {
			return
		}
		back, err := ParseEngineFlag(e.String())
		if err != nil {
			t.Fatalf("%q parsed to %s whose String %q does not parse: %v", s, show(e), e.String(), err)
		}
		if !back.Equal(e) {
			t.Fatalf("%q: round trip through %q gave %s, want %s", s, e.String(), show(back), show(e))
		}
	})
}

func TestFromConfig(t *testing.T) {
	warm := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	got, err := FromConfig([]config.Engine{
		{Name: "b", URL: "http://10.0.0.2:8000/", Events: []string{"tcp://10.0.0.2:5557"}, Replay: []string{"tcp://10.0.0.2:5600"}},
		{Name: "a", URL: "http://10.0.0.1:8000", WarmupUntil: &warm},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Engine{
		{Name: "a", URL: "http://10.0.0.1:8000", Ready: true, WarmupUntil: warm.Time},
		{Name: "b", URL: "http://10.0.0.2:8000", Ready: true, Events: []string{"tcp://10.0.0.2:5557"}, Replay: []string{"tcp://10.0.0.2:5600"}},
	}
	if !equalSnapshots(got, want) {
		t.Fatalf("FromConfig = %s, want %s (sorted by name)", show(got...), show(want...))
	}

	for _, tc := range []struct {
		in      []config.Engine
		wantErr string
	}{
		{[]config.Engine{{Name: "a", URL: "http://h:1"}, {Name: "a", URL: "http://h:2"}}, `"a" is listed twice`},
		{[]config.Engine{{Name: "a", URL: "http://h:1/v1"}}, "engines[0] (a)"},
		{[]config.Engine{{Name: "a", URL: "http://h:1", Events: []string{"tcp://h:1"}, Replay: []string{"tcp://h:2", "tcp://h:3"}}}, "replay has 2 endpoints"},
		{[]config.Engine{{Name: "", URL: "http://h:1"}}, "name before '=' is empty"},
	} {
		if _, err := FromConfig(tc.in); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("FromConfig(%+v) = %v, want an error mentioning %q", tc.in, err, tc.wantErr)
		}
	}
}

func TestParseTopic(t *testing.T) {
	good := []struct{ in, prefix, host, model string }{
		{"kv@10.0.0.5@qwen", "kv", "10.0.0.5", "qwen"},
		{"kv@10.0.0.5:5557@qwen", "kv", "10.0.0.5:5557", "qwen"},
		{"kv@[fd00::1]:5557@Qwen/Qwen3-8B", "kv", "[fd00::1]:5557", "Qwen/Qwen3-8B"},
		{"kv@fd00::1@m", "kv", "fd00::1", "m"},
		{"kv@engine-0.ns.svc@org/model@rev", "kv", "engine-0.ns.svc", "org/model@rev"},
	}
	for _, tc := range good {
		p, h, m, err := ParseTopic(tc.in)
		if err != nil || p != tc.prefix || h != tc.host || m != tc.model {
			t.Errorf("ParseTopic(%q) = %q %q %q %v, want %q %q %q", tc.in, p, h, m, err, tc.prefix, tc.host, tc.model)
		}
	}
	bad := []struct{ in, wantErr string }{
		{"", "no '@'"},
		{"kv-events", "no '@'"},
		{"kv@10.0.0.5", "no '@' after the host"},
		{"@10.0.0.5@m", "empty prefix"},
		{"kv@@m", "empty host"},
		{"kv@10.0.0.5@", "empty model"},
		{"kv@10.0.0.5:x@m", "not in 1..65535"},
		{"kv@:5557@m", "no name before the port"},
		{"kv@a:b:c@m", "neither host:port nor a bare IPv6"},
		{"kv@a b@m", "contains a space"},
	}
	for _, tc := range bad {
		if _, _, _, err := ParseTopic(tc.in); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ParseTopic(%q) = %v, want an error mentioning %q", tc.in, err, tc.wantErr)
		}
	}
}

func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"kv@10.0.0.5:5557@qwen", "kv@[fd00::1]:1@org/m@rev", "kv@fd00::1@m", "@@", "a@b@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		p, h, m, err := ParseTopic(topic)
		if err != nil {
			return
		}
		if p == "" || h == "" || m == "" || p+"@"+h+"@"+m != topic {
			t.Fatalf("ParseTopic(%q) = %q %q %q, which does not rebuild the topic", topic, p, h, m)
		}
	})
}

// A fleet runs one engine kind: an engine of another is named; one without kind= takes the
// fleet's.
func TestMixedKinds(t *testing.T) {
	es := []Engine{{Name: "a"}, {Name: "b", Kind: engine.SGLang}}
	if err := MixedKinds(engine.SGLang, es); err != nil {
		t.Errorf("an SGLang fleet of one unmarked and one SGLang engine: %v", err)
	}
	err := MixedKinds(engine.VLLM, es)
	if err == nil || !strings.Contains(err.Error(), "engine b is kind=sglang but the router runs vllm engines") {
		t.Errorf("a vLLM fleet with an SGLang engine: %v", err)
	}
}
