import { describe, expect, it } from "vitest"
import { adminRequestRefusal } from "../../../src/control/gateway/AdminGuard.js"

const options = { boundHost: "127.0.0.1", allowedHosts: ["cornserve.internal"] }
const json = { "content-type": "application/json" }

describe("the admin routes' guard against cross-site requests and DNS rebinding", () => {
  it("lets through a JSON request that names this server", () => {
    for (const host of [
      "127.0.0.1:8000",
      "localhost:8000",
      "[::1]:8000",
      "10.0.0.5",
      "cornserve.internal:8000",
      "LOCALHOST"
    ]) {
      expect(adminRequestRefusal({ host, ...json }, options), host).toBeUndefined()
    }
    expect(
      adminRequestRefusal({ host: "localhost:8000", origin: "http://localhost:8000", ...json }, options)
    ).toBeUndefined()
    expect(
      adminRequestRefusal({ host: "localhost", "content-type": "application/json; charset=utf-8" }, options)
    ).toBeUndefined()
  })

  it("refuses a Host that is a foreign name (DNS rebinding) or missing", () => {
    expect(adminRequestRefusal({ host: "attacker.example:8000", ...json }, options)).toContain("Host")
    expect(adminRequestRefusal({ host: "localhost.attacker.example", ...json }, options)).toContain("Host")
    expect(adminRequestRefusal({ ...json }, options)).toContain("Host")
    expect(adminRequestRefusal({ host: "", ...json }, options)).toContain("Host")
  })

  it("refuses a foreign, opaque or malformed Origin (CSRF)", () => {
    for (const origin of [
      "http://attacker.example",
      "null",
      "not a url",
      "https://cornserve.internal.attacker.example"
    ]) {
      expect(adminRequestRefusal({ host: "localhost:8000", origin, ...json }, options), origin).toContain("origin")
    }
  })

  it("refuses bodies that a cross-site form can send without a preflight", () => {
    for (const contentType of ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]) {
      expect(adminRequestRefusal({ host: "localhost", "content-type": contentType }, options)).toContain(
        "application/json"
      )
    }
    expect(adminRequestRefusal({ host: "localhost" }, options)).toContain("application/json")
  })

  it("takes a name bound with --host as this server's", () => {
    expect(
      adminRequestRefusal({ host: "gpu-box:8000", ...json }, { boundHost: "gpu-box", allowedHosts: [] })
    ).toBeUndefined()
  })
})
