/** Geri's NDJSON audio answer read as it streams: its PCM16 chunks and when the first one came. */

const pcmOfBase64 = (base64: string) => {
  const bytes = Buffer.from(base64, "base64")
  // A copy: the decoded Buffer may sit at an odd offset of Node's pool.
  return new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length))
}

export interface AudioLines {
  readonly parts: ReadonlyArray<Int16Array>
  /** Seconds from `start` (performance.now()) to the first chunk line. */
  readonly ttfaSeconds: number
}

/** The chunks of `response`, checked: every chunk at `sampleRate`, a done line at the end, no error line. */
export const readAudioLines = async (response: Response, start: number, sampleRate: number): Promise<AudioLines> => {
  if (response.status !== 200 || response.body === null)
    throw new Error(`Geri answered ${response.status}: ${await response.text()}`)
  const parts: Array<Int16Array> = []
  let ttfa: number | undefined
  let done = false
  let pending = ""
  const decoder = new TextDecoder()
  const onLine = (line: string) => {
    if (line.trim() === "") return
    const parsed = JSON.parse(line) as {
      readonly audio?: string
      readonly sampleRate?: number
      readonly done?: boolean
      readonly error?: unknown
    }
    if (parsed.error !== undefined) throw new Error(`Geri's stream failed: ${JSON.stringify(parsed.error)}`)
    if (parsed.done === true) done = true
    else if (parsed.audio !== undefined) {
      ttfa ??= (performance.now() - start) / 1000
      if (parsed.sampleRate !== sampleRate) throw new Error(`Geri's audio is at ${parsed.sampleRate} Hz`)
      parts.push(pcmOfBase64(parsed.audio))
    }
  }
  for await (const bytes of response.body) {
    pending += decoder.decode(bytes, { stream: true })
    const lines = pending.split("\n")
    pending = lines.pop()!
    for (const line of lines) onLine(line)
  }
  onLine(pending + decoder.decode())
  if (!done || ttfa === undefined) throw new Error("Geri's stream ended without its done line")
  return { parts, ttfaSeconds: ttfa }
}
