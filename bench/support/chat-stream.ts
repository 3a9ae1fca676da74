import { executorHeaders } from "../../test/support/executors.js"
import http from "node:http"

/**
 * What the LLM benches share: the prompts, one streamed chat completion timed as a client sees it,
 * and the statistics they report.
 */

export const benchPrompts = [
  "Write a short story about a lighthouse keeper who finds a message in a bottle.",
  "Explain how a transformer decoder uses its key and value cache during generation.",
  "List five things to pack for a weekend hike in the mountains.",
  "What colour is the sky on Mars at sunset, and why?",
  "Translate 'good morning, how are you today?' into French and German.",
  "Summarize the plot of a heist movie in three sentences.",
  "Give me a recipe for a quick vegetable soup.",
  "Describe the sound of rain on a tin roof to someone who has never heard it."
]

export interface Run {
  /** The completion's text, special tokens left out. */
  readonly text: string
  readonly tokens: number
  readonly firstTokenMs: number
  readonly decodeMs: number
  readonly endMs: number
}

export const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted.length % 2 === 1
    ? sorted[(sorted.length - 1) / 2]!
    : (sorted[sorted.length / 2 - 1]! + sorted[sorted.length / 2]!) / 2
}
/** p-th percentile (0–100) of `values`, nearest rank. */
export const percentile = (values: ReadonlyArray<number>, p: number): number => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!
}

export const mean = (values: ReadonlyArray<number>) => values.reduce((sum, value) => sum + value, 0) / values.length
export const round = (value: number, digits = 2) => Number(value.toFixed(digits))

/** Connections kept open between runs, as a client of a serving platform keeps them. */
const agent = new http.Agent({ keepAlive: true })

/**
 * One streamed greedy chat completion of `maxTokens` tokens (end of sequence ignored) from the
 * executor at `url`; times are from `origin` (performance.now()). The client is node:http, which
 * takes less of the cores it shares with the server than fetch's web streams do; it still reads
 * every event as it arrives.
 */
export const streamed = (
  url: string,
  model: string,
  /** The user message's content: a text, or content parts (an image and a question, say). */
  prompt: string | ReadonlyArray<Readonly<Record<string, unknown>>>,
  maxTokens: number,
  origin: number,
  /** More of the request (a response_format, or messages in place of the one user message). */
  extra: Readonly<Record<string, unknown>> = {},
  /** Called as each chunk with content arrives; `stop` hangs up, and the run so far is the answer. */
  events: { readonly onContent?: (now: number) => void; readonly stop?: AbortSignal } = {}
): Promise<Run> =>
  new Promise((resolve, reject) => {
    const body = JSON.stringify({
      model,
      messages: [{ role: "user", content: prompt }],
      max_tokens: maxTokens,
      ignore_eos: true,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
      ...extra
    })
    const request = http.request(
      new URL("/v1/chat/completions", url),
      { method: "POST", agent, headers: executorHeaders({ "content-type": "application/json" }) },
      (response) => {
        response.setEncoding("utf8")
        if (response.statusCode !== 200) {
          let answer = ""
          response.on("data", (piece: string) => (answer += piece))
          response.on("end", () => reject(new Error(`the executor answered ${response.statusCode}: ${answer}`)))
          return
        }
        let text = ""
        let firstAt: number | undefined
        let endAt = 0
        let completionTokens = 0
        let pending = ""
        response.on("data", (piece: string) => {
          const now = performance.now()
          pending += piece
          const received = pending.split("\n\n")
          pending = received.pop()!
          for (const event of received) {
            const data = event.slice("data: ".length)
            if (data === "[DONE]") continue
            const chunk = JSON.parse(data) as {
              choices: Array<{ delta: { content?: string }; finish_reason: string | null }>
              usage?: { completion_tokens: number } | null
            }
            for (const choice of chunk.choices) {
              if (choice.delta.content !== undefined && choice.delta.content.length > 0) {
                firstAt ??= now
                text += choice.delta.content
                events.onContent?.(now)
              }
              if (choice.finish_reason !== null) endAt = now
            }
            if (chunk.usage) completionTokens = chunk.usage.completion_tokens
          }
        })
        const answer = () =>
          resolve({
            text,
            tokens: completionTokens,
            firstTokenMs: firstAt! - origin,
            decodeMs: endAt - firstAt!,
            endMs: endAt - origin
          })
        response.on("end", answer)
        response.on("error", (error) => (events.stop?.aborted ? answer() : reject(error)))
        response.on("aborted", () => events.stop?.aborted && answer())
      }
    )
    events.stop?.addEventListener("abort", () => request.destroy(), { once: true })
    request.on("error", reject)
    request.end(body)
  })

export interface Figure {
  readonly tokensPerSecond: number
  readonly ttftMs: number
}

/** Each path's median tokens/s and time to first token. */
export const figuresOf = <K extends string>(
  samples: Record<K, { readonly rate: ReadonlyArray<number>; readonly ttft: ReadonlyArray<number> }>
): Record<K, Figure> =>
  Object.fromEntries(
    Object.entries<{ readonly rate: ReadonlyArray<number>; readonly ttft: ReadonlyArray<number> }>(samples).map(
      ([name, sample]) => [
        name,
        { tokensPerSecond: round(median(sample.rate), 1), ttftMs: round(median(sample.ttft), 1) }
      ]
    )
  ) as Record<K, Figure>

/** Prints `title`, then one aligned row per path: load, path, tokens/s, kind, mean TTFT. */
export const printTable = (
  title: string,
  rows: ReadonlyArray<readonly [load: string, path: string, figure: Figure, kind: string]>
): void => {
  const table = [
    ["load", "path", "tokens/s", "kind", "TTFT ms (mean)"],
    ...rows.map(([load, path, figure, kind]) => [
      load,
      path,
      String(figure.tokensPerSecond),
      kind,
      String(figure.ttftMs)
    ])
  ]
  const widths = table[0]!.map((_, column) => Math.max(...table.map((row) => row[column]!.length)))
  console.log(title)
  for (const row of table) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
}
