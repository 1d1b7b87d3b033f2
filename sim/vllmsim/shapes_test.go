package vllmsim

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/router/kvwire"
)

// Every --event-layout value puts its shape on the wire, as the router's decoder sees it.
func TestEventLayoutShapesOnTheWire(t *testing.T) {
	for layout, want := range map[string]kvwire.Shape{"E1": kvwire.ShapeE1, "E2": kvwire.ShapeE2, "E3": kvwire.ShapeE3,
		"array": kvwire.ShapeE1, "map": kvwire.ShapeE3, "": kvwire.ShapeE3} {
		t.Run("layout="+layout, func(t *testing.T) {
			cfg := eventConfig()
			cfg.EventLayout = layout
			s := startSim(t, cfg)
			sub := subscribe(t, s.EventEndpoints()[0], s.Topic())
			complete(t, s, map[string]any{"prompt": seqTokens(0, 40)})
			_, b := recvBatch(t, sub)
			if b.Shape() != want || len(b.Events) != 1 || b.Events[0].Type != kvwire.EventBlockStored ||
				len(b.Events[0].Stored.BlockHashes) != 2 {
				t.Fatalf("shape %v with %d events, want %v with one BlockStored of 2 blocks", b.Shape(), len(b.Events), want)
			}
		})
	}
	cfg := eventConfig()
	cfg.EventLayout = "msgpack"
	if _, err := New(cfg); err == nil {
		t.Error("layout msgpack accepted")
	}
}

// replayAll asks for every buffered batch from seq 0 and returns the raw replies (end marker last).
func replayAll(t *testing.T, endpoint string) [][][]byte {
	t.Helper()
	dealer, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	_ = dealer.SetLinger(0)
	_ = dealer.SetRcvtimeo(5 * time.Second)
	if err := dealer.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := dealer.SendMessage("", make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		frames, err := dealer.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay reply: %v", err)
		}
		out = append(out, frames)
		if len(frames[len(frames)-1]) == 0 {
			return out
		}
	}
}

// --replay-topic-frame=false answers replay as vLLM did before PR #45177: ["", seq, payload] and
// the end marker ["", ff*8, ""]; the default has the topic frame.
func TestReplayWithoutTopicFrame(t *testing.T) {
	for _, noTopic := range []bool{false, true} {
		cfg := eventConfig()
		cfg.ReplayNoTopicFrame = noTopic
		s := startSim(t, cfg)
		sub := subscribe(t, s.EventEndpoints()[0], s.Topic())
		complete(t, s, map[string]any{"prompt": seqTokens(0, 33)})
		live, _ := recvBatch(t, sub)
		replies := replayAll(t, s.ReplayEndpoints()[0])
		want := 4
		if noTopic {
			want = 3
		}
		if len(replies) != 2 || len(replies[0]) != want || len(replies[1]) != want {
			t.Fatalf("noTopic=%v: replies %d, frames %v; want 2 replies of %d frames", noTopic, len(replies), replies, want)
		}
		m, end, err := kvwire.ParseReplayReply(replies[0])
		if err != nil || end || m.Seq != 0 || string(m.Payload) != string(live.Payload) {
			t.Errorf("noTopic=%v: replayed %+v end=%v err=%v, want the live batch 0", noTopic, m, end, err)
		}
		if !noTopic && string(m.Topic) != s.Topic() {
			t.Errorf("replayed topic %q, want %q", m.Topic, s.Topic())
		}
		if m, end, err := kvwire.ParseReplayReply(replies[1]); err != nil || !end || m.Seq != kvwire.EndSeq {
			t.Errorf("noTopic=%v: end marker %x: %+v %v %v", noTopic, replies[1], m, end, err)
		}
	}
}

// vLLM sets no HWM on the replay ROUTER (kv_events.py), so libzmq's default send HWM of 1000
// holds; the sim must not raise it (a replaying router has to read as it goes, not the sim
// buffer more). The PUB socket's HWM is the configured one (vLLM's hwm, default 100000).
func TestReplaySocketKeepsDefaultHWM(t *testing.T) {
	s := startSim(t, eventConfig())
	rep := s.ranks[0].pub.replay
	hwm, err := rep.GetSndhwm()
	if err != nil || hwm != 1000 {
		t.Errorf("replay ROUTER send HWM %d (%v), want libzmq's default 1000", hwm, err)
	}
	if hwm, _ := s.ranks[0].pub.pub.GetSndhwm(); hwm != s.Config().HWM {
		t.Errorf("PUB send HWM %d, want the configured %d", hwm, s.Config().HWM)
	}
}
