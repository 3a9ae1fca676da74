import { MediaError, MediaTooLarge } from "./errors.js"

/**
 * The one reader of `data:` URLs (RFC 2397): the encoder decodes a request's media with it and the
 * control plane's embedding cache keys on what it returns, so that the two can never see different
 * bytes under one URL. (Two lenient readers once disagreed on `;Base64` and on data after a `=`: a
 * crafted URL then stored one image's embedding under another image's key, for every client.)
 *
 * Strict: the `;base64` flag in any case, base64 of the standard alphabet with padding only at its
 * end (unpadded is taken), percent-encoding that decodes; anything else is refused, not guessed.
 */

export interface DataUrlMedia {
  readonly bytes: Buffer
  readonly mimeType: string | undefined
}

const base64Body = /^[A-Za-z0-9+/]*={0,2}$/

const tooLarge = (maxBytes: number) =>
  new MediaTooLarge({ message: `the media is larger than the limit of ${maxBytes} bytes` })

/** The bytes and media type of a `data:` URL, or a MediaError / MediaTooLarge thrown. */
export const readDataUrl = (url: string, maxBytes: number): DataUrlMedia => {
  if (url.slice(0, 5).toLowerCase() !== "data:") throw new MediaError({ message: "not a data: URL" })
  const comma = url.indexOf(",")
  if (comma < 0) throw new MediaError({ message: "a data: URL needs a comma before its data" })
  const parameters = url.slice("data:".length, comma).split(";")
  const base64 = parameters.length > 1 && parameters[parameters.length - 1]!.trim().toLowerCase() === "base64"
  const mimeType = parameters[0]!.trim().toLowerCase() || undefined
  const data = url.slice(comma + 1)
  if (!base64) {
    if (data.length > maxBytes * 3) throw tooLarge(maxBytes)
    let text: string
    try {
      text = decodeURIComponent(data)
    } catch {
      throw new MediaError({ message: "a data: URL's percent-encoding does not decode" })
    }
    const bytes = Buffer.from(text)
    if (bytes.length > maxBytes) throw tooLarge(maxBytes)
    return { bytes, mimeType }
  }
  if (Math.floor((data.length * 3) / 4) > maxBytes + 3) throw tooLarge(maxBytes)
  if (!base64Body.test(data) || data.length % 4 === 1 || (data.includes("=") && data.length % 4 !== 0)) {
    throw new MediaError({ message: "a data: URL's base64 is malformed (standard alphabet, padding only at its end)" })
  }
  const bytes = Buffer.from(data, "base64")
  if (bytes.length > maxBytes) throw tooLarge(maxBytes)
  return { bytes, mimeType }
}
