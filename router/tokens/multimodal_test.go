package tokens

import "testing"

func TestMultimodal(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`:                                                                      false,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`:                                             false,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"?"},{"type":"image_url","image_url":{"url":"x"}}]}]}`: true,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]}]}`:        true,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"x"}}]}]}`:                            true,
		`{"model":"m","messages":[{"role":"user","content":[{"image_url":{"url":"x"}}]}]}`:                                               true,
		`{"model":"m","prompt":"hi"}`:                                             false,
		`{"model":"m","prompt":"hi","multi_modal_data":{"image":"x"}}`:            true,
		`{"model":"m","prompt":{"prompt":"hi","multi_modal_data":{}}}`:            true,
		`{"model":"m","prompt":[{"prompt_token_ids":[1],"multi_modal_data":{}}]}`: true,
		`not json`: false,
	} {
		if got := Multimodal([]byte(body)); got != want {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
}
