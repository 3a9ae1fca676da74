/**
 * `multipart/form-data` bodies (RFC 7578), as OpenAI's clients upload audio to
 * `/v1/audio/transcriptions`: the boundary from the content type, then each part's headers (its
 * field name, a file's name and type) and bytes. Bounded: at most `maxParts` parts, headers of at
 * most `maxHeaderBytes` each; a body that does not follow the format is refused, saying where.
 */

export interface FormPart {
  readonly name: string
  readonly filename?: string
  readonly contentType?: string
  readonly data: Buffer
}

export const maxParts = 64
const maxHeaderBytes = 8 * 1024

/** The boundary of a `multipart/form-data` content type, or why it has none. */
export const multipartBoundary = (contentType: string | undefined): string | { readonly problem: string } => {
  const [type = "", ...parameters] = (contentType ?? "").split(";")
  if (type.trim().toLowerCase() !== "multipart/form-data") return { problem: "not multipart/form-data" }
  for (const parameter of parameters) {
    const at = parameter.indexOf("=")
    if (at < 0 || parameter.slice(0, at).trim().toLowerCase() !== "boundary") continue
    const boundary = parameter
      .slice(at + 1)
      .trim()
      .replace(/^"(.*)"$/, "$1")
    // RFC 2046: 1 to 70 characters.
    if (boundary.length === 0 || boundary.length > 70) return { problem: "its boundary is empty or over 70 characters" }
    return boundary
  }
  return { problem: "multipart/form-data without a boundary" }
}

/** A header's parameter (`name="file"`), quoted or not; quoted ones may hold `\"`. */
const parameterOf = (header: string, name: string): string | undefined => {
  const pattern = new RegExp(`(?:^|;)\\s*${name}\\s*=\\s*(?:"((?:[^"\\\\]|\\\\.)*)"|([^;\\s]*))`, "i")
  const match = pattern.exec(header)
  if (match === null) return undefined
  return match[1] !== undefined ? match[1].replace(/\\(.)/g, "$1") : match[2]
}

/** The parts of a body, or why it is not a form. */
export const parseMultipart = (
  body: Buffer,
  boundary: string
): ReadonlyArray<FormPart> | { readonly problem: string } => {
  const delimiter = Buffer.from(`--${boundary}`)
  const next = Buffer.from(`\r\n--${boundary}`)
  let at = body.indexOf(delimiter)
  if (at < 0) return { problem: "the body holds no part: its boundary is not in it" }
  const parts: Array<FormPart> = []
  for (;;) {
    at += delimiter.length
    if (body[at] === 0x2d && body[at + 1] === 0x2d) return parts // "--": the closing delimiter
    if (body[at] !== 0x0d || body[at + 1] !== 0x0a) return { problem: "a boundary is not followed by a line break" }
    at += 2
    if (parts.length === maxParts) return { problem: `the form has more than ${maxParts} parts` }
    const headerEnd = body.indexOf("\r\n\r\n", at)
    if (headerEnd < 0 || headerEnd - at > maxHeaderBytes) {
      return { problem: `part ${parts.length + 1}'s headers do not end within ${maxHeaderBytes} bytes` }
    }
    const headers = new Map<string, string>()
    for (const line of body.toString("utf8", at, headerEnd).split("\r\n")) {
      const colon = line.indexOf(":")
      if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim())
    }
    const end = body.indexOf(next, headerEnd + 4)
    if (end < 0) return { problem: `part ${parts.length + 1} has no closing boundary` }
    const disposition = headers.get("content-disposition") ?? ""
    const name = parameterOf(disposition, "name")
    if (!disposition.toLowerCase().startsWith("form-data") || name === undefined) {
      return { problem: `part ${parts.length + 1} has no content-disposition: form-data with a name` }
    }
    const filename = parameterOf(disposition, "filename")
    const contentType = headers.get("content-type")
    parts.push({
      name,
      ...(filename === undefined ? {} : { filename }),
      ...(contentType === undefined ? {} : { contentType }),
      data: body.subarray(headerEnd + 4, end)
    })
    at = end + 2
  }
}
