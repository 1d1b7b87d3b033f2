package vllmsim

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The simulator's fixed chat template is ChatML (Qwen2's), applied as text and then tokenized:
//
//	for each message:      <|im_start|>{role}\n{content}<|im_end|>\n
//	add_generation_prompt: <|im_start|>assistant\n            (default true)
//	continue_final_message: the last message is left open (no <|im_end|>\n, no generation prompt)
//
// Content is a string or a list of {"type":"text","text":...} parts, joined without separator.
// Other part types (images, audio) are refused: the simulator has no multimodal processor.

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func messageText(m chatMessage) (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", fmt.Errorf("message content must be a string or a list of text parts")
	}
	var b strings.Builder
	for _, p := range parts {
		// The Responses API's input_text and output_text parts are text to the chat template.
		if p.Type != "text" && p.Type != "input_text" && p.Type != "output_text" {
			return "", fmt.Errorf("content part type %q is not supported by the simulator (text only)", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// renderChat applies the chat template and returns the prompt text.
func renderChat(msgs []chatMessage, addGenerationPrompt, continueFinal bool) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("messages must not be empty")
	}
	if addGenerationPrompt && continueFinal {
		return "", fmt.Errorf("continue_final_message and add_generation_prompt cannot both be true")
	}
	var b strings.Builder
	for i, m := range msgs {
		if m.Role == "" {
			return "", fmt.Errorf("message %d has no role", i)
		}
		text, err := messageText(m)
		if err != nil {
			return "", fmt.Errorf("message %d: %w", i, err)
		}
		b.WriteString("<|im_start|>" + m.Role + "\n" + text)
		if continueFinal && i == len(msgs)-1 {
			break
		}
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}
