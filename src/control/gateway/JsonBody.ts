import { shortened } from "../../app-runtime/Shortened.js"

/**
 * Request bodies as JSON, parsed within bounds: a body nested deeper than the limit is refused before
 * it is parsed, so that no later recursive walk (schema validation, error formatting, cloning between
 * threads) can run out of stack on it.
 */

export const defaultMaxJsonDepth = 64

/** How deeply `text` nests arrays and objects, or `undefined` as soon as it passes `limit`. Strings are skipped. */
export const jsonDepthWithin = (text: string, limit: number): number | undefined => {
  let depth = 0
  let deepest = 0
  let inString = false
  for (let index = 0; index < text.length; index++) {
    const code = text.charCodeAt(index)
    if (inString) {
      if (code === 0x5c)
        index++ // backslash: skip the escaped character
      else if (code === 0x22) inString = false
    } else if (code === 0x22) inString = true
    else if (code === 0x5b || code === 0x7b) {
      depth++
      if (depth > limit) return undefined
      if (depth > deepest) deepest = depth
    } else if (code === 0x5d || code === 0x7d) depth--
  }
  return deepest
}

export const tooDeepMessage = (maxDepth: number) =>
  `the request body nests arrays and objects deeper than the limit of ${maxDepth}`

export type JsonBodyResult =
  | { readonly ok: true; readonly value: unknown }
  | { readonly ok: false; readonly message: string }

/** Parses a request body, refusing one nested deeper than `maxDepth`; the message never echoes the body. */
export const parseJsonBody = (text: string, maxDepth: number): JsonBodyResult => {
  if (jsonDepthWithin(text, maxDepth) === undefined) return { ok: false, message: tooDeepMessage(maxDepth) }
  try {
    return { ok: true, value: JSON.parse(text) }
  } catch (error) {
    return { ok: false, message: `the request body is not JSON: ${shortened((error as Error).message)}` }
  }
}
