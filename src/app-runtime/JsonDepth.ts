/**
 * How deeply JSON text nests, counted before it is parsed: whatever crosses into the platform (a
 * request body, a message from an app's process) is refused when it nests deeper than a limit, so
 * that no later recursive walk (schema decoding, error formatting, cloning between threads) can
 * run out of stack on it.
 */

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
