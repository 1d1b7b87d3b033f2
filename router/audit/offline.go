package audit

import (
	"encoding/json"
	"errors"
	"strings"
)

// BodyUnits turns one OpenAI request body (completion or chat) into the offline audit's units:
// the characters of its prompt, or its token ids when the prompt is given as ids (text false:
// no shape can be read from them). A chat's messages are joined as "role: content" lines, a
// stand-in for the engine's chat template that keeps their order and text.
func BodyUnits(body []byte) (units []uint32, text bool, err error) {
	var b struct {
		Prompt   json.RawMessage `json:"prompt"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, false, err
	}
	switch {
	case len(b.Messages) > 0:
		var sb strings.Builder
		for _, m := range b.Messages {
			sb.WriteString(m.Role)
			sb.WriteString(": ")
			sb.WriteString(contentText(m.Content))
			sb.WriteString("\n")
		}
		return ToRunes(sb.String()), true, nil
	case len(b.Prompt) > 0:
		var s string
		if json.Unmarshal(b.Prompt, &s) == nil {
			return ToRunes(s), true, nil
		}
		var ss []string
		if json.Unmarshal(b.Prompt, &ss) == nil && len(ss) > 0 {
			return ToRunes(ss[0]), true, nil
		}
		var ids []uint32
		if json.Unmarshal(b.Prompt, &ids) == nil {
			return ids, false, nil
		}
		var idss [][]uint32
		if json.Unmarshal(b.Prompt, &idss) == nil && len(idss) > 0 {
			return idss[0], false, nil
		}
		return nil, false, errors.New("prompt is neither text nor token ids")
	}
	return nil, false, errors.New("no prompt or messages")
}

// contentText is a message's text: a string, or the text parts of a content list.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	return sb.String()
}

// LeadStats is what a captured trace says about prompt starts: chained ids cannot say why, but
// they show how often a prompt's first 512-token block was never seen before.
type LeadStats struct {
	Requests int `json:"requests"`
	// NewFirstBlock is the share of requests whose first block id no earlier request had.
	NewFirstBlock float64 `json:"new_first_block"`
	// RepeatedFirstBlock is the share whose first block an earlier request had.
	RepeatedFirstBlock float64 `json:"repeated_first_block"`
}

// FirstBlockStats computes LeadStats over requests' hash ids in arrival order.
func FirstBlockStats(ids [][]uint64) LeadStats {
	seen := map[uint64]bool{}
	st := LeadStats{Requests: len(ids)}
	if len(ids) == 0 {
		return st
	}
	fresh := 0
	for _, h := range ids {
		if len(h) == 0 {
			continue
		}
		if !seen[h[0]] {
			fresh++
			seen[h[0]] = true
		}
	}
	st.NewFirstBlock = float64(fresh) / float64(len(ids))
	st.RepeatedFirstBlock = 1 - st.NewFirstBlock
	return st
}
