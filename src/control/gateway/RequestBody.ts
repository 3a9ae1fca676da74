import type { IncomingMessage } from "node:http"
import { BadRequest, PayloadTooLarge } from "../errors.js"

/**
 * Reads a request body of at most `limitBytes`. A body declared or found larger is refused at
 * once; the rest of it is drained, not read, so that the 413 still reaches the client.
 */
export const readRequestBody = (
  request: IncomingMessage,
  limitBytes: number,
  done: (result: string | PayloadTooLarge | BadRequest) => void
): void => {
  if (Number(request.headers["content-length"] ?? 0) > limitBytes) {
    request.resume()
    done(new PayloadTooLarge({ limitBytes }))
    return
  }
  const chunks: Array<Buffer> = []
  let size = 0
  let finished = false
  const finish = (result: string | PayloadTooLarge | BadRequest) => {
    if (finished) return
    finished = true
    request.off("data", onData)
    done(result)
  }
  const onData = (chunk: Buffer) => {
    size += chunk.length
    if (size <= limitBytes) chunks.push(chunk)
    else {
      request.resume()
      finish(new PayloadTooLarge({ limitBytes }))
    }
  }
  request.on("data", onData)
  request.once("end", () =>
    finish(chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8"))
  )
  request.once("error", (error) => finish(new BadRequest({ message: `reading the body failed: ${error.message}` })))
}
