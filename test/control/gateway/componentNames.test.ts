import { describe, expect, it } from "vitest"
import type { JsonSchema } from "../../../src/app-runtime/driver/AppSchemas.js"
import { componentNames } from "../../../src/control/gateway/ComponentNames.js"

const app = (id: string, defs: Record<string, JsonSchema>) => ({ id, schemas: { defs: new Map(Object.entries(defs)) } })
const ref = (name: string) => ({ $ref: `#/$defs/${name}` })
const platform = new Map<string, JsonSchema>([["ErrorAnswer", { type: "object" }]])

describe("the names apps' schemas take in a document", () => {
  it("keeps a name every app gives alike, names another for its app, and suffixes a name taken", () => {
    const names = componentNames(platform, [
      app("a", { Same: { type: "string" }, Differs: { type: "string" }, "Differs.b": { type: "null" } }),
      app("b", { Same: { type: "string" }, Differs: { type: "number" } })
    ])
    expect(Object.fromEntries(names.get("a")!)).toEqual({
      Same: "Same",
      Differs: "Differs.a",
      "Differs.b": "Differs.b"
    })
    expect(Object.fromEntries(names.get("b")!)).toEqual({ Same: "Same", Differs: "Differs.b_2" })
  })

  it("names for its app a schema that refers, however indirectly, to one named for its app", () => {
    const names = componentNames(platform, [
      app("a", {
        Top: ref("Middle"),
        Middle: { anyOf: [ref("ErrorAnswer"), { type: "null" }] },
        ErrorAnswer: { type: "string" },
        Apart: { type: "integer" }
      })
    ])
    expect(Object.fromEntries(names.get("a")!)).toEqual({
      Top: "Top.a",
      Middle: "Middle.a",
      ErrorAnswer: "ErrorAnswer.a",
      Apart: "Apart"
    })
  })

  it("walks a chain of 20,000 references to a name named for its app in linear time", () => {
    const defs: Record<string, JsonSchema> = { ErrorAnswer: { type: "string" } }
    for (let index = 0; index < 20_000; index++)
      defs[`d${index}`] = ref(index === 19_999 ? "ErrorAnswer" : `d${index + 1}`)
    const names = componentNames(platform, [app("a", defs)]).get("a")!
    expect(names.get("d0")).toBe("d0.a")
    expect([...names.values()].every((name) => name.endsWith(".a"))).toBe(true)
  })
})
