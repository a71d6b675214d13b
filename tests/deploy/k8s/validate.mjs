// validate.mjs - validates Kubernetes manifests offline against the
// Kubernetes OpenAPI schemas that the npm package kubernetes-models ships
// (one model class per apiVersion/kind, validate() checks the object).
//   node validate.mjs --modules DIR FILE...   (multi-document YAML files)
// Prints one line per object; exits 1 when any object fails or has a kind
// the package does not know.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = process.argv.slice(2);
const mi = args.indexOf("--modules");
if (mi < 0 || mi + 1 >= args.length) {
  console.error("usage: node validate.mjs --modules NODE_MODULES FILE...");
  process.exit(2);
}
const modules = path.resolve(args[mi + 1]);
const files = args.filter((_, i) => i !== mi && i !== mi + 1);
const require = createRequire(path.join(modules, "x.js"));
const yaml = require("js-yaml");
const pkgRoot = path.join(modules, "kubernetes-models");

let bad = 0;
for (const f of files) {
  let docs;
  try {
    docs = yaml.loadAll(readFileSync(f, "utf8")).filter((d) => d);
  } catch (e) {
    console.log(`FAIL ${f}: not YAML: ${e.message.split("\n")[0]}`);
    bad++;
    continue;
  }
  for (const doc of docs) {
    const name = `${f}: ${doc.kind}/${doc.metadata && doc.metadata.name}`;
    const av = String(doc.apiVersion || "");
    const mod = path.join(pkgRoot, ...av.split("/"), `${doc.kind}.js`);
    let Cls;
    try {
      Cls = (await import(pathToFileURL(mod).href))[doc.kind];
    } catch (e) {
      console.log(`FAIL ${name}: no schema for ${av} ${doc.kind}`);
      bad++;
      continue;
    }
    try {
      new Cls(doc).validate();
      console.log(`ok   ${name}`);
    } catch (e) {
      console.log(`FAIL ${name}: ${e.message.split("\n").slice(0, 6).join(" | ")}`);
      bad++;
    }
  }
}
process.exit(bad ? 1 : 0);
