package tokens

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Only server, auth and connection failures of the engine's render are the engine's fault.
func TestEngineFault(t *testing.T) {
	for code, want := range map[int]bool{500: true, 503: true, 401: true, 403: true, 400: false, 422: false, 413: false} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no", code)
		}))
		tk := New(Options{})
		r, err := Parse(Completion, []byte(`{"model":"m","prompt":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = tk.Tokens(context.Background(), srv.URL, r, []byte(`{"model":"m","prompt":"hello"}`))
		srv.Close()
		if err == nil || EngineFault(err) != want {
			t.Errorf("%d: err %v, engine fault %v, want %v", code, err, EngineFault(err), want)
		}
	}
	tk := New(Options{})
	r, _ := Parse(Completion, []byte(`{"model":"m","prompt":"x"}`))
	_, _, err := tk.Tokens(context.Background(), "http://127.0.0.1:1", r, nil)
	if err == nil || !EngineFault(err) {
		t.Errorf("connection refused: %v, engine fault %v", err, EngineFault(err))
	}
	if EngineFault(fmt.Errorf("wrapped: %w", errors.New("bad prompt"))) {
		t.Error("a plain error is not an engine fault")
	}
}
