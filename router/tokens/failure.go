package tokens

import (
	"errors"
	"net/http"
	"net/url"
)

// EngineFault reports whether a tokenization error is the engine's or the network's: a 5xx, a
// 401/403 (the router is not allowed to render), or a connection error or timeout. A 4xx about
// the request itself is the client's and is never an engine fault.
func EngineFault(err error) bool {
	var ee *EngineError
	if errors.As(err, &ee) {
		return ee.Status >= 500 || ee.Status == http.StatusUnauthorized || ee.Status == http.StatusForbidden
	}
	var ue *url.Error
	return errors.As(err, &ue)
}
