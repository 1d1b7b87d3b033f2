package tokens

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
)

// StatusError is a render or tokenize call the engine answered with a status other than 200
// (and other than the 404/405 of an engine without the endpoint).
type StatusError struct {
	URL  string
	Code int
	Msg  string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("tokens: %s answered %d: %s", e.URL, e.Code, e.Msg)
}

// EngineFault reports whether a tokenization error is the engine's or the network's: a 5xx, a
// 401/403 (the router is not allowed to render), or a connection error or timeout. A 4xx about
// the request itself is the client's and is never an engine fault.
func EngineFault(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code >= 500 || se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden
	}
	var ue *url.Error
	return errors.As(err, &ue)
}
