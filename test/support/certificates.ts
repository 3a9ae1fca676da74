import { execFileSync } from "node:child_process"
import { writeFile } from "node:fs/promises"
import { join } from "node:path"

/** Whether openssl(1) is on this machine: the tests that need certificates make them with it. */
export const hasOpenssl = (() => {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" })
    return true
  } catch {
    return false
  }
})()

/**
 * A CA (`ca.pem`, `ca.key`), and a certificate for 127.0.0.1 it signed (`server.pem`, `server.key`),
 * in `dir`.
 */
export const makeCertificates = (dir: string) => {
  const openssl = (...args: Array<string>) => execFileSync("openssl", args, { cwd: dir, stdio: "ignore" })
  openssl(
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    "ca.key",
    "-out",
    "ca.pem",
    "-days",
    "2",
    "-subj",
    "/CN=cornserve-test-ca"
  )
  openssl(
    "req",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    "server.key",
    "-out",
    "server.csr",
    "-subj",
    "/CN=127.0.0.1"
  )
  return writeFile(join(dir, "san.ext"), "subjectAltName=IP:127.0.0.1\n").then(() =>
    openssl(
      "x509",
      "-req",
      "-in",
      "server.csr",
      "-CA",
      "ca.pem",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-out",
      "server.pem",
      "-days",
      "2",
      "-extfile",
      "san.ext"
    )
  )
}
