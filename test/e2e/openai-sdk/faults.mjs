// Drives kvrouter with the official openai SDK through faults, unchanged. Three routers:
// KVROUTE_URL_RETRY fronts one engine that fails every stream after accepting it and one good
// engine (every answer must come back clean); KVROUTE_URL_ENGINE_ERROR fronts an engine that sends
// vLLM's in-stream error after a few tokens; KVROUTE_URL_CUT fronts an engine that dies mid-stream.
// In the last two the SDK must raise. Prints one JSON line of what it saw.
import OpenAI from "openai";

const model = process.env.KVROUTE_MODEL ?? "vllm-sim";
const client = (url) => new OpenAI({ baseURL: url, apiKey: "sk-test", maxRetries: 0 });
const out = { retry_clean: 0, retry_failed: [] };

const retry = client(process.env.KVROUTE_URL_RETRY);
for (let i = 0; i < 8; i++) {
  try {
    let text = "", finish = null;
    const s = await retry.chat.completions.create({ model, max_tokens: 4, stream: true,
      messages: [{ role: "user", content: `retry me ${i}` }] });
    for await (const c of s) {
      text += c.choices?.[0]?.delta?.content ?? "";
      finish = c.choices?.[0]?.finish_reason ?? finish;
    }
    if (text !== "" && finish === "length") out.retry_clean++;
    else out.retry_failed.push(`text=${JSON.stringify(text)} finish=${finish}`);
  } catch (e) {
    out.retry_failed.push(String(e));
  }
}

async function mustRaise(url, key) {
  let chunks = 0;
  try {
    const s = await client(url).completions.create({ model, prompt: "cut me", max_tokens: 50, stream: true });
    for await (const c of s) chunks++;
    out[key] = { raised: false, chunks };
  } catch (e) {
    out[key] = { raised: true, chunks, error: String(e).slice(0, 200) };
  }
}
await mustRaise(process.env.KVROUTE_URL_ENGINE_ERROR, "engine_error");
await mustRaise(process.env.KVROUTE_URL_CUT, "cut");
console.log(JSON.stringify(out));
