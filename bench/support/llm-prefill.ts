/**
 * The prefill measurements of the models bench, through an LLM executor's chat API:
 *
 * - time to first token with a repeated ~1,000-token system prompt: cold (a system prompt no
 *   request sent before) and cached (the same system prompt as the request before, another
 *   question);
 * - inter-token latency of 4 running streams: alone, and while a ~2,000-token prompt joins them
 *   (from the moment it is sent to its first token).
 */
import type { ChatTokenizer } from "../../src/models/Tokenizer.js"
import { median, streamed } from "./chat-stream.js"

type Message = { readonly role: "system" | "user"; readonly content: string }

/** A streamed greedy chat completion, end of sequence ignored: when each chunk came. Stops early when `stop` is aborted. */
export const timedStream = (
  url: string,
  model: string,
  messages: ReadonlyArray<Message>,
  maxTokens: number,
  stop?: AbortSignal
): { readonly chunks: Array<number>; readonly done: Promise<Array<number>> } => {
  const chunks: Array<number> = []
  const done = streamed(
    url,
    model,
    "",
    maxTokens,
    performance.now(),
    { messages },
    {
      onContent: (now) => chunks.push(now),
      ...(stop === undefined ? {} : { stop })
    }
  ).then(() => chunks)
  return { chunks, done }
}

const words = [
  "amber",
  "river",
  "quiet",
  "stone",
  "lantern",
  "orbit",
  "meadow",
  "copper",
  "signal",
  "harbor",
  "velvet",
  "cinder"
]

/** A text of about `tokens` tokens of the model's tokenizer, different for each `seed`. */
export const textOfTokens = (tokenizer: ChatTokenizer, tokens: number, seed: number): string => {
  let state = seed * 2654435761
  const next = () => {
    state = (state * 1103515245 + 12345) % 2 ** 31
    return state
  }
  let text = `Note ${seed}.`
  while (tokenizer.encode(text).length < tokens) {
    const sentence = Array.from({ length: 8 }, () => words[next() % words.length]).join(" ")
    text += ` ${sentence} ${next() % 1000}.`
  }
  return text
}

/** TTFT (ms) of cold and cached system prompts, `rounds` of each, alternating; medians and each round. */
export const systemPromptTtft = async (
  url: string,
  model: string,
  tokenizer: ChatTokenizer,
  rounds: number,
  systemTokens = 1000
) => {
  const cold: Array<number> = []
  const cached: Array<number> = []
  for (let round = 0; round < rounds; round++) {
    const system = textOfTokens(tokenizer, systemTokens, 1000 + round)
    const ask = async (question: string) => {
      const started = performance.now()
      const { done } = timedStream(
        url,
        model,
        [
          { role: "system", content: system },
          { role: "user", content: question }
        ],
        2
      )
      const chunks = await done
      return chunks[0]! - started
    }
    cold.push(await ask("What is the first word?"))
    cached.push(await ask("And which word comes most often?"))
  }
  return { cold: median(cold), cached: median(cached), coldRounds: cold, cachedRounds: cached }
}

/**
 * Inter-token latencies (ms) of 4 streams: their gaps while they run alone (after their first
 * few tokens), and, with `joinTokens`, their gaps from when a prompt of that many tokens is sent
 * until its first token. Answers the gaps, and the joining prompt's time to first token.
 */
export const streamGaps = async (
  url: string,
  model: string,
  tokenizer: ChatTokenizer,
  options: { readonly joinTokens?: number; readonly seed: number; readonly aloneTokens?: number }
) => {
  const stop = new AbortController()
  const streams = [0, 1, 2, 3].map((i) =>
    timedStream(
      url,
      model,
      [{ role: "user", content: `Count to a thousand, slowly, number ${options.seed}.${i}.` }],
      options.joinTokens === undefined ? (options.aloneTokens ?? 120) : 4000,
      stop.signal
    )
  )
  // Until each stream runs.
  while (streams.some((stream) => stream.chunks.length < 8)) await new Promise((resolve) => setTimeout(resolve, 5))
  if (options.joinTokens === undefined) {
    const all = await Promise.all(streams.map((stream) => stream.done))
    return { gaps: all.flatMap((chunks) => gapsOf(chunks.slice(8))), joinTtft: undefined }
  }
  const sent = performance.now()
  const joining = timedStream(
    url,
    model,
    [{ role: "user", content: textOfTokens(tokenizer, options.joinTokens, options.seed) }],
    1
  )
  const [first] = await joining.done
  // A few gaps after it too: the step that gives its first token is one of them.
  await new Promise((resolve) => setTimeout(resolve, 300))
  stop.abort()
  const all = await Promise.all(streams.map((stream) => stream.done))
  // Each gap that overlaps the window from the send to just after the first token.
  const end = first! + 300
  const gaps = all.flatMap((chunks) =>
    chunks.flatMap((time, i) => (i > 0 && time > sent && chunks[i - 1]! < end ? [time - chunks[i - 1]!] : []))
  )
  return { gaps, joinTtft: first! - sent }
}

const gapsOf = (times: ReadonlyArray<number>): Array<number> => times.slice(1).map((time, i) => time - times[i]!)
