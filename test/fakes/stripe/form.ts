/**
 * Stripe's request encoding: `application/x-www-form-urlencoded` with bracket notation for nested
 * objects and arrays (`metadata[account_id]=...`, `line_items[0][price_data][unit_amount]=500`,
 * `expand[]=data.customer`). Values stay strings, as Stripe receives them; each endpoint coerces.
 */

export type FormValue = string | FormObject | FormValue[];
export interface FormObject {
  [key: string]: FormValue;
}

/** `a[b][0][c]` -> ['a', 'b', '0', 'c']; `expand[]` -> ['expand', '']. */
function pathOf(key: string): string[] {
  const m = /^([^[\]]+)((?:\[[^[\]]*\])*)$/.exec(key);
  if (!m) return [key];
  const rest = [...m[2]!.matchAll(/\[([^[\]]*)\]/g)].map((x) => x[1]!);
  return [m[1]!, ...rest];
}

export function decodeForm(body: string): FormObject {
  const root: FormObject = {};
  for (const [key, value] of new URLSearchParams(body)) {
    const path = pathOf(key);
    let node: FormObject | FormValue[] = root;
    for (let i = 0; i < path.length; i++) {
      const part = path[i]!;
      const last = i === path.length - 1;
      const nextIsIndex = !last && /^\d*$/.test(path[i + 1]!);
      if (Array.isArray(node)) {
        const idx = part === '' ? node.length : Number(part);
        if (last) node[idx] = value;
        else node = (node[idx] ??= nextIsIndex ? [] : {}) as FormObject | FormValue[];
      } else if (last) {
        node[part] = value;
      } else {
        node = (node[part] ??= nextIsIndex ? [] : {}) as FormObject | FormValue[];
      }
    }
  }
  return root;
}
