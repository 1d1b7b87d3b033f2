// Drives a kvrouter with the official openai SDK, unchanged. KVROUTE_URL is the router's
// base URL (http://127.0.0.1:PORT/v1). Prints one JSON line of what it saw; exits 1 on a
// failed check.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.KVROUTE_URL, apiKey: "sk-test", maxRetries: 0 });
const model = process.env.KVROUTE_MODEL ?? "vllm-sim";
const out = {};
const fail = (msg) => { console.error(msg); process.exit(1); };

const cmpl = await client.completions.create({ model, prompt: "hello from the sdk", max_tokens: 4 });
if (!cmpl.choices?.[0]?.text) fail("completion without text");
out.completion_text = cmpl.choices[0].text;
out.completion_cached = cmpl.usage?.prompt_tokens_details?.cached_tokens ?? null;

const chat = await client.chat.completions.create({ model, max_tokens: 4,
  messages: [{ role: "system", content: "be brief" }, { role: "user", content: "hi" }] });
if (!chat.choices?.[0]?.message?.content) fail("chat without content");
out.chat_text = chat.choices[0].message.content;

let chunks = 0, text = "", usageChunks = 0;
const stream = await client.chat.completions.create({ model, max_tokens: 5, stream: true,
  messages: [{ role: "user", content: "stream please" }] });
for await (const c of stream) {
  chunks++;
  if (c.usage) usageChunks++;
  text += c.choices?.[0]?.delta?.content ?? "";
}
if (chunks === 0 || text === "") fail("empty stream");
if (usageChunks !== 0) fail("usage chunk reached a client that did not ask for it");
out.stream_chunks = chunks;
out.stream_text = text;

let withUsage = null;
const s2 = await client.completions.create({ model, prompt: "count", max_tokens: 3, stream: true,
  stream_options: { include_usage: true } });
for await (const c of s2) if (c.usage) withUsage = c.usage;
if (!withUsage) fail("asked for usage, got none");
out.stream_usage_prompt_tokens = withUsage.prompt_tokens;

try {
  await client.chat.completions.create({ model, messages: [] });
  fail("empty messages accepted");
} catch (e) {
  if (e.status !== 400) fail(`bad request answered ${e.status}`);
  out.bad_request_type = e.error?.type ?? e.type ?? null;
}
console.log(JSON.stringify(out));
