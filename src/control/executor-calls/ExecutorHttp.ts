import * as Http from "node:http"

/**
 * An executor's answer to a POST: its status, and its body read whole or as it arrives (reading it
 * slowly holds the executor's stream back through TCP).
 */
export interface ExecutorAnswer {
  readonly status: number
  readonly ok: boolean
  readonly body: AsyncIterable<Uint8Array>
  text(): Promise<string>
  json(): Promise<unknown>
}

/** The header that carries the internal secret, which every executor route but its health probes checks. */
export const credentialHeaders = (secret: string): Readonly<Record<string, string>> => ({
  authorization: `Bearer ${secret}`
})

/** Connections to executors stay open between calls. */
const agent = new Http.Agent({ keepAlive: true })

/**
 * POSTs `json` to an executor over node:http. Not fetch: fetch keeps each request's signal (and a
 * listener on it) in a FinalizationRegistry until its cleanup runs, which under steady load comes
 * late, so every call's signal piled up in the platform's heap. Rejects with the connection's
 * error when nothing answers; `signal` aborts the call, its answer's body included. `headers` go
 * with the request (the credential, a trace's `traceparent`).
 */
export const postJson = (
  url: string,
  json: string,
  signal: AbortSignal,
  headers?: Readonly<Record<string, string>>
): Promise<ExecutorAnswer> =>
  new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason)
    const request = Http.request(
      url,
      {
        method: "POST",
        agent,
        headers: { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(json) }
      },
      (response) => {
        const status = response.statusCode ?? 0
        const text = async () => {
          const chunks: Array<Buffer> = []
          for await (const chunk of response) chunks.push(chunk as Buffer)
          return Buffer.concat(chunks).toString("utf8")
        }
        resolve({
          status,
          ok: status >= 200 && status < 300,
          body: response,
          text,
          json: async () => JSON.parse(await text()) as unknown
        })
      }
    )
    const onAbort = () => request.destroy(signal.reason instanceof Error ? signal.reason : new Error("aborted"))
    signal.addEventListener("abort", onAbort, { once: true })
    request.once("close", () => signal.removeEventListener("abort", onAbort))
    // Before the answer: nothing answered. After it, a broken connection fails the body's reader.
    request.once("error", reject)
    request.end(json)
  })
