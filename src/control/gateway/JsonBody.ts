import { jsonDepthWithin } from "../../app-runtime/JsonDepth.js"
import { shortened } from "../../app-runtime/Shortened.js"

/**
 * Request bodies as JSON, parsed within bounds: a body nested deeper than the limit is refused before
 * it is parsed, so that no later recursive walk (schema validation, error formatting, cloning between
 * threads) can run out of stack on it.
 */

/** The gateway counts with the app runtime's reader: one depth rule for every JSON that crosses in. */
export { jsonDepthWithin }

export const defaultMaxJsonDepth = 64

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
