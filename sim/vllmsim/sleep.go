package vllmsim

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Sleep mode as vLLM's EngineCore has it (vllm/v1/engine/core.py sleep / pause_scheduler /
// wake_up; HTTP routes in vllm/entrypoints/serve/sleep/api_router.py, earlier in
// vllm/entrypoints/openai/api_server.py, served by vLLM only with VLLM_SERVER_DEV_MODE=1 and, for
// levels 1 and 2, --enable-sleep-mode; the sim always serves them, like /reset_prefix_cache.
// Older v1 releases reset the prefix cache in AsyncLLM.sleep at every level; the sim follows the
// current level >= 1 rule):
//   - sleep(level, mode) first pauses the scheduler: mode "abort" (default) aborts every request,
//     waiting or running; "wait" lets the running ones finish and schedules no new one; "keep"
//     freezes everything. Requests that arrive while paused are accepted and queued.
//   - level >= 1 then resets the prefix cache (the KV memory is discarded): AllBlocksCleared on
//     every rank, as POST /reset_prefix_cache publishes it. Level 0 only pauses scheduling.
//   - wake_up(tags) wakes the given tags ("weights", "kv_cache", "scheduling"; all when none);
//     scheduling resumes when "scheduling" is woken. is_sleeping holds until every tag is awake.

// errAborted fails the requests a sleep in mode "abort" drops (vLLM: FINISHED_ABORTED).
var errAborted = errors.New("request aborted: the engine was put to sleep")

type pauseState int

const (
	unpaused  pauseState = iota
	pausedNew            // running requests continue, waiting ones are not scheduled
	pausedAll            // nothing is scheduled
)

// sleepState is the server's sleep bookkeeping: the tags still asleep, and what
// vllm:engine_sleep_state shows.
type sleepState struct {
	mu   sync.Mutex
	tags []string
	// gauge is vLLM's record_sleep_state(sleep, level) (vllm/v1/metrics/loggers.py,
	// PrometheusStatLogger): AsyncLLM.sleep records (1, level), AsyncLLM.wake_up records (0, 0)
	// whatever its tags (vllm/v1/engine/async_llm.py), so a partial wake already reads awake
	// while /is_sleeping still says true.
	gauge sleepGauge
}

// sleepGauge is the last record_sleep_state call.
type sleepGauge struct {
	asleep bool
	level  int
}

// values are vllm:engine_sleep_state's three series: awake is 0 while asleep, weights_offloaded
// 1 at level 1, discard_all 1 at level 2 (level 0 sets neither).
func (g sleepGauge) values() (awake, weightsOffloaded, discardAll float64) {
	if !g.asleep {
		return 1, 0, 0
	}
	switch g.level {
	case 1:
		weightsOffloaded = 1
	case 2:
		discardAll = 1
	}
	return 0, weightsOffloaded, discardAll
}

// sleepGauge reads the gauge's state for /metrics.
func (s *sleepState) sleepGauge() sleepGauge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gauge
}

// pause applies pause_scheduler's request handling on one rank.
func (rk *rank) pause(mode string) {
	rk.mu.Lock()
	if mode == "abort" {
		for _, r := range append(slices.Clone(rk.running), rk.waiting...) {
			rk.finish(r, errAborted)
		}
	}
	rk.paused = pausedNew
	if mode == "keep" {
		rk.paused = pausedAll
	}
	rk.setGauges()
	rk.mu.Unlock()
	rk.poke()
}

// drained reports whether no request is running (mode "wait" waits for it).
func (rk *rank) drained() bool {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return len(rk.running) == 0
}

func (rk *rank) resume() {
	rk.mu.Lock()
	rk.paused = unpaused
	rk.mu.Unlock()
	rk.poke()
}

// Sleep is vLLM's sleep(level, mode) on every rank; it returns once the engine is asleep (in
// mode "wait", after the running requests finished).
func (s *Sim) Sleep(ctx context.Context, level int, mode string) error {
	for _, rk := range s.ranks {
		rk.pause(mode)
	}
	if mode == "wait" {
		for _, rk := range s.ranks {
			for !rk.drained() {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
		}
	}
	tags := []string{"scheduling"}
	if level >= 1 {
		tags = []string{"weights", "kv_cache", "scheduling"}
		s.ResetPrefixCache(ctx) // a rank still holding blocks (mode "keep") keeps them, as in vLLM
	}
	s.sleep.mu.Lock()
	for _, t := range tags {
		if !slices.Contains(s.sleep.tags, t) {
			s.sleep.tags = append(s.sleep.tags, t)
		}
	}
	s.sleep.gauge = sleepGauge{asleep: true, level: level}
	s.sleep.mu.Unlock()
	return nil
}

// WakeUp wakes the given tags (all when none are given); scheduling resumes with "scheduling".
func (s *Sim) WakeUp(tags []string) {
	s.sleep.mu.Lock()
	resume := len(tags) == 0 || slices.Contains(tags, "scheduling")
	if len(tags) == 0 {
		s.sleep.tags = nil
	} else {
		s.sleep.tags = slices.DeleteFunc(s.sleep.tags, func(t string) bool { return slices.Contains(tags, t) })
	}
	s.sleep.gauge = sleepGauge{}
	s.sleep.mu.Unlock()
	if resume {
		for _, rk := range s.ranks {
			rk.resume()
		}
	}
}

// IsSleeping reports whether some tag is still asleep.
func (s *Sim) IsSleeping() bool {
	s.sleep.mu.Lock()
	defer s.sleep.mu.Unlock()
	return len(s.sleep.tags) > 0
}

// handleSleep is POST /sleep?level=1&mode=abort (vLLM's defaults).
func (s *Sim) handleSleep(w http.ResponseWriter, r *http.Request) {
	level, mode := 1, "abort"
	if v := r.URL.Query().Get("level"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 2 {
			writeError(w, badRequest("level must be 0, 1 or 2, got %q", v))
			return
		}
		level = n
	}
	if v := r.URL.Query().Get("mode"); v != "" {
		if v != "abort" && v != "wait" && v != "keep" {
			writeError(w, badRequest("mode must be abort, wait or keep, got %q", v))
			return
		}
		mode = v
	}
	if err := s.Sleep(r.Context(), level, mode); err != nil {
		writeError(w, &apiError{http.StatusServiceUnavailable, "ServiceUnavailableError", err.Error(), ""})
		return
	}
	w.WriteHeader(http.StatusOK)
}

// handleWakeUp is POST /wake_up[?tags=weights&tags=kv_cache&tags=scheduling].
func (s *Sim) handleWakeUp(w http.ResponseWriter, r *http.Request) {
	s.WakeUp(r.URL.Query()["tags"])
	w.WriteHeader(http.StatusOK)
}

// handleIsSleeping is GET /is_sleeping: {"is_sleeping": bool}.
func (s *Sim) handleIsSleeping(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": s.IsSleeping()})
}
