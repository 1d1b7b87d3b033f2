package discovery

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvroute/kvroute/router/config"
)

// BenchmarkKubernetesSnapshot is the work done per debounced change: map every cached pod
// of a 256-replica model (DP 2) to an Engine and sort.
func BenchmarkKubernetesSnapshot(b *testing.B) {
	pods := make([]*corev1.Pod, 256)
	for i := range pods {
		p := enginePod(fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), map[string]string{
			config.DefaultEventsPortsAnnotation: "5557,5558",
			config.DefaultReplayPortsAnnotation: "5600,5601",
			config.DefaultBlockSizeAnnotation:   "16",
			config.DefaultWarmupUntilAnnotation: "2026-05-06T07:08:09Z",
		})
		p.Name = fmt.Sprintf("engine-%03d", 255-i)
		p.UID = types.UID(fmt.Sprintf("uid-%d", i))
		pods[i] = p
	}
	o := KubernetesOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	o.fill()
	s := &kubeSource{o: o}
	problems := map[string]string{}
	b.ReportAllocs()
	for b.Loop() {
		if es := s.engines(pods, problems); len(es) != 256 {
			b.Fatal(len(es))
		}
	}
}

func BenchmarkParseEngineFlag(b *testing.B) {
	const s = "e1=http://10.0.0.1:8000;events=tcp://10.0.0.1:5557,tcp://10.0.0.1:5558;replay=tcp://10.0.0.1:5600,tcp://10.0.0.1:5601;warmup-until=2026-03-04T05:06:07Z"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseEngineFlag(s); err != nil {
			b.Fatal(err)
		}
	}
}
