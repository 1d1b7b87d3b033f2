package discovery

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/engine"
)

type static struct{ engines []Engine }

// NewStatic is a source whose set never changes: Run reports it once and waits for ctx.
// Validate the list first with CheckSnapshot (ParseEngineFlag and FromConfig results are
// valid one by one; duplicates across entries are what CheckSnapshot adds).
func NewStatic(engines []Engine) Source {
	es := cloneSnapshot(engines)
	sortEngines(es)
	return &static{engines: es}
}

func (s *static) Run(ctx context.Context, update func([]Engine)) error {
	update(cloneSnapshot(s.engines))
	<-ctx.Done()
	return nil
}

// CheckSnapshot refuses a set in which two engines share a name: the router keys streams,
// metrics and the index by name.
func CheckSnapshot(engines []Engine) error {
	seen := make(map[string]bool, len(engines))
	var errs []error
	for _, e := range engines {
		if seen[e.Name] {
			errs = append(errs, fmt.Errorf("engine %q is listed twice", e.Name))
		}
		seen[e.Name] = true
	}
	return errors.Join(errs...)
}

// FromConfig converts the configuration file's static engines, checking each as
// ParseEngineFlag would (the config schema validates loosely: any URL path, any host).
func FromConfig(c []config.Engine) ([]Engine, error) {
	out := make([]Engine, 0, len(c))
	var errs []error
	for i, ce := range c {
		e, err := fromConfigEngine(ce)
		if err != nil {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): %w", i, ce.Name, err))
			continue
		}
		out = append(out, e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := CheckSnapshot(out); err != nil {
		return nil, err
	}
	sortEngines(out)
	return out, nil
}

func fromConfigEngine(ce config.Engine) (Engine, error) {
	if err := checkName(ce.Name); err != nil {
		return Engine{}, err
	}
	u, err := parseEngineURL(ce.URL)
	if err != nil {
		return Engine{}, err
	}
	e := Engine{Name: ce.Name, URL: u, Ready: true}
	for _, list := range []struct {
		key string
		in  []string
		out *[]string
	}{{keyEvents, ce.Events, &e.Events}, {keyReplay, ce.Replay, &e.Replay}} {
		for r, raw := range list.in {
			ep, err := parseEndpoint(raw)
			if err != nil {
				return Engine{}, fmt.Errorf("%s rank %d: %w", list.key, r, err)
			}
			*list.out = append(*list.out, ep)
		}
	}
	if err := checkReplay(e); err != nil {
		return Engine{}, err
	}
	if ce.WarmupUntil != nil {
		e.WarmupUntil = ce.WarmupUntil.Time
	}
	if ce.Kind != "" {
		k, err := engine.Parse(ce.Kind)
		if err != nil {
			return Engine{}, err
		}
		e.Kind = k
	}
	return e, nil
}
