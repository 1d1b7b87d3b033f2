package vllmsim

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// guardedPrefixes are the paths vLLM's --api-key protects. vLLM's AuthenticationMiddleware
// (vllm/entrypoints/serve/utils/server_utils.py, GUARDED_PREFIX; vllm/entrypoints/openai/
// server_utils.py in earlier releases, where it was "/v1" alone) checks the path, root path
// removed, with a plain string prefix test; everything else (/health, /metrics, /tokenize,
// /detokenize, /ping, /version, ...) stays open. OPTIONS requests (CORS preflight) are never
// checked.
var guardedPrefixes = []string{"/v1", "/v2", "/inference", "/cohere"}

// unauthorizedBody is vLLM's answer to a missing or wrong key: a 401 whose JSON body is
// {"error": "Unauthorized"} (a bare string, not the OpenAI error object of other errors).
const unauthorizedBody = `{"error":"Unauthorized"}`

// requireAPIKey wraps h like vLLM's middleware when keys are configured: the request must
// carry "Authorization: Bearer <one of keys>" (scheme case-insensitive, as vLLM's
// str.lower() comparison) on a guarded path. Keys are compared as SHA-256 digests in
// constant time, as vLLM does, so the comparison leaks neither a key's length nor prefix.
//
// SGLang's --api-key middleware (add_api_key_middleware, python/sglang/srt/utils/common.py of
// sgl-project/sglang at 4e75f4684b6b) guards every path but /health* and /metrics* (so its
// /tokenize and /v1/models need the key too) and wants the header to be exactly
// "Bearer <key>"; its 401 body is the same.
func requireAPIKey(h http.Handler, keys []string, kind string) http.Handler {
	if len(keys) == 0 {
		return h
	}
	digests := make([][sha256.Size]byte, len(keys))
	for i, k := range keys {
		digests[i] = sha256.Sum256([]byte(k))
	}
	isGuarded, isAuthorized := guarded, authorized
	if kind == KindSGLang {
		isGuarded = func(path string) bool {
			return !strings.HasPrefix(path, "/health") && !strings.HasPrefix(path, "/metrics")
		}
		isAuthorized = func(header string, digests [][sha256.Size]byte) bool {
			return strings.HasPrefix(header, "Bearer ") && authorized(header, digests)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions || !isGuarded(r.URL.Path) || isAuthorized(r.Header.Get("Authorization"), digests) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(unauthorizedBody))
	})
}

func guarded(path string) bool {
	for _, p := range guardedPrefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

func authorized(header string, digests [][sha256.Size]byte) bool {
	scheme, param, _ := strings.Cut(header, " ")
	if header == "" || !strings.EqualFold(scheme, "bearer") {
		return false
	}
	got := sha256.Sum256([]byte(param))
	ok := 0
	for _, d := range digests {
		ok |= subtle.ConstantTimeCompare(got[:], d[:])
	}
	return ok == 1
}
