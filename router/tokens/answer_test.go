package tokens

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
)

// stdIDs is what the answer reader replaced: encoding/json into a struct of []int64, then the
// range check. engineIDs must accept and refuse the same answers.
func stdIDs(answer []byte, first bool) ([]uint32, bool) {
	type gen struct {
		TokenIDs []int64 `json:"token_ids"`
	}
	var g gen
	if first {
		var gs []gen
		if json.Unmarshal(answer, &gs) != nil || len(gs) == 0 {
			return nil, false
		}
		g = gs[0]
	} else if json.Unmarshal(answer, &g) != nil {
		return nil, false
	}
	if len(g.TokenIDs) == 0 {
		return nil, false
	}
	out := make([]uint32, len(g.TokenIDs))
	for i, v := range g.TokenIDs {
		if v < 0 || v > math.MaxUint32 {
			return nil, false
		}
		out[i] = uint32(v)
	}
	return out, true
}

func TestEngineIDsAsEncodingJSON(t *testing.T) {
	objects := []string{
		`{"token_ids":[1,2,3]}`,
		`{"request_id":"x","token_ids":[7, 8 ,9 ],"sampling_params":{"max_tokens":16,"stop":["]"]},"model":"m"}`,
		`{"text":"\"token_ids\":[5]","token_ids":[4]}`,
		`{"token_ids":[1],"token_ids":[2,3]}`,
		`{"Token_IDs":[6]}`,
		`{"token_ids":null}`,
		`{"token_ids":[]}`,
		`{}`,
		`{"token_ids":[1.5]}`,
		`{"token_ids":[1e3]}`,
		`{"token_ids":["1"]}`,
		`{"token_ids":[-1]}`,
		`{"token_ids":[4294967295,0]}`,
		`{"token_ids":[4294967296]}`,
		`{"token_ids":[9223372036854775808]}`,
		`{"token_ids":[1,]}`,
		`{"token_ids":[1 2]}`,
		`{"token_ids":[1]`,
		`{"token_ids":{"a":1}}`,
		`null`,
		`[1]`,
	}
	for _, o := range objects {
		for _, c := range []struct {
			answer string
			first  bool
		}{{o, false}, {"[" + o + "]", true}, {"[" + o + `,{"token_ids":[99]}]`, true}} {
			want, ok := stdIDs([]byte(c.answer), c.first)
			got, err := engineIDs([]byte(c.answer), "token_ids", c.first)
			if ok != (err == nil) || !slices.Equal(got, want) {
				t.Errorf("%s: got %v %v, encoding/json %v (accepted %v)", c.answer, got, err, want, ok)
			}
		}
	}
	for _, a := range []string{`[]`, `null`} {
		if _, err := engineIDs([]byte(a), "token_ids", true); err != errNoPrompt {
			t.Errorf("%s: %v, want %v", a, err, errNoPrompt)
		}
	}
}

// jsonString must decode every JSON value as json.Unmarshal into a string does.
func TestJSONStringAsEncodingJSON(t *testing.T) {
	for _, raw := range []string{`"plain text"`, `""`, `"tab\tescaped"`, `"quote \" inside"`, `"\u00e9t\u00e9"`,
		`"été 日本"`, "\"bad \xff utf8\"", "\"cut \xe6\x97\"", `"\ud800 lone surrogate"`, `12`, `null`, `["a"]`, `{"a":1}`, `true`} {
		var want string
		wantErr := json.Unmarshal([]byte(raw), &want)
		got, ok := jsonString([]byte(raw))
		if ok != (wantErr == nil) || got != want {
			t.Errorf("%q: got %q %v, encoding/json %q %v", raw, got, ok, want, wantErr)
		}
	}
}
