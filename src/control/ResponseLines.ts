/** The lines of a streamed HTTP body (NDJSON, Server-Sent Events) as they arrive, without their line ends. */
export async function* responseLines(response: {
  readonly body: AsyncIterable<Uint8Array> | ReadableStream<Uint8Array> | null
}): AsyncIterable<string> {
  const decoder = new TextDecoder()
  let pending = ""
  for await (const bytes of response.body as unknown as AsyncIterable<Uint8Array>) {
    pending += decoder.decode(bytes, { stream: true })
    for (let newline = pending.indexOf("\n"); newline >= 0; newline = pending.indexOf("\n")) {
      yield pending.slice(0, newline).replace(/\r$/, "")
      pending = pending.slice(newline + 1)
    }
  }
  pending += decoder.decode()
  if (pending.length > 0) yield pending
}
