import { describe, expect, it } from "vitest"
import { shortened } from "../../../src/app-runtime/Shortened.js"
import { jsonDepthWithin, parseJsonBody } from "../../../src/control/gateway/JsonBody.js"

const nested = (depth: number) => `${"[".repeat(depth)}1${"]".repeat(depth)}`

describe("request bodies parsed within bounds", () => {
  it("measures nesting, skipping brackets inside strings and escaped quotes", () => {
    expect(jsonDepthWithin("1", 64)).toBe(0)
    expect(jsonDepthWithin('{"a":[1,{"b":2}]}', 64)).toBe(3)
    expect(jsonDepthWithin('{"a":"[[[[{{{{\\"[[[["}', 64)).toBe(1)
    expect(jsonDepthWithin(nested(64), 64)).toBe(64)
    expect(jsonDepthWithin(nested(65), 64)).toBeUndefined()
  })

  it("parses a body at the limit and refuses one past it, without echoing it", () => {
    expect(parseJsonBody(nested(64), 64)).toEqual({ ok: true, value: JSON.parse(nested(64)) })
    const refused = parseJsonBody(`{"name":${nested(100_000)}}`, 64)
    expect(refused.ok).toBe(false)
    if (!refused.ok) {
      expect(refused.message).toContain("deeper than the limit of 64")
      expect(refused.message.length).toBeLessThan(200)
    }
  })

  it("refuses text that is not JSON with a short message", () => {
    const refused = parseJsonBody(`x${"y".repeat(1_000_000)}`, 64)
    expect(refused.ok).toBe(false)
    if (!refused.ok) expect(refused.message.length).toBeLessThan(300)
  })

  it("shortens long messages and leaves short ones alone", () => {
    expect(shortened("short")).toBe("short")
    expect(shortened("z".repeat(1000), 10)).toBe(`${"z".repeat(10)}… (990 more characters)`)
  })
})
