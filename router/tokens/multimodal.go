package tokens

import (
	"bytes"
	"encoding/json"
)

// multimodalParts are the chat content part types that carry media (OpenAI's and vLLM's).
var multimodalParts = map[string]bool{
	"image_url": true, "input_image": true, "image": true, "image_pil": true, "image_embeds": true,
	"input_audio": true, "audio_url": true, "audio": true, "audio_embeds": true,
	"video_url": true, "video": true,
}

// Multimodal reports whether an OpenAI body carries media: a chat message content part of a media
// type (image_url, input_audio, video_url, ...) or vLLM's multi_modal_data (top level or on a
// prompt object). The engine hashes such blocks with the media's identity as an extra key, which
// the router does not compute yet, so these requests are routed by load without keys.
func Multimodal(body []byte) bool {
	// Every media part type and multi_modal_data names one of these: a text-only body (almost
	// every one) is not parsed a second time.
	if !bytes.Contains(body, []byte("image")) && !bytes.Contains(body, []byte("audio")) &&
		!bytes.Contains(body, []byte("video")) && !bytes.Contains(body, []byte("multi_modal_data")) {
		return false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return false
	}
	if _, ok := top["multi_modal_data"]; ok {
		return true
	}
	if p, ok := top["prompt"]; ok && hasKey(p, "multi_modal_data") {
		return true
	}
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if m, ok := top["messages"]; !ok || json.Unmarshal(m, &msgs) != nil {
		return false
	}
	for _, m := range msgs {
		var parts []map[string]json.RawMessage
		if json.Unmarshal(m.Content, &parts) != nil {
			continue // a string content
		}
		for _, part := range parts {
			var typ string
			_ = json.Unmarshal(part["type"], &typ)
			if multimodalParts[typ] {
				return true
			}
			for k := range part {
				if k != "type" && multimodalParts[k] {
					return true
				}
			}
		}
	}
	return false
}

// hasKey reports whether raw is an object with key, or an array holding such an object.
func hasKey(raw json.RawMessage, key string) bool {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) == nil {
		_, ok := obj[key]
		return ok
	}
	var arr []json.RawMessage
	if json.Unmarshal(raw, &arr) == nil {
		for _, a := range arr {
			if json.Unmarshal(a, &obj) == nil {
				if _, ok := obj[key]; ok {
					return true
				}
			}
		}
	}
	return false
}
