# spade: domain=tool_use skill=api-orchestration
"""Online shop: look up the customer and the product, fill the cart, apply a one-time coupon,
check out once with the requested shipping, then email the receipt of the new order.
Each call needs an id returned by an earlier one (customer id, SKU, order id)."""

import json

FIRST = ["Maya", "Tom", "Priya", "Lukas", "Amara", "Jonas", "Sofia", "Ravi", "Elena", "Omar"]
LAST = ["Lindqvist", "Okafor", "Moreau", "Tanaka", "Silva", "Novak", "Haddad", "Keller"]
PRODUCTS = [
    ("Ceramic mug", ["350 ml", "500 ml"], "kitchen"),
    ("Steel water bottle", ["0.5 l", "1 l"], "outdoor"),
    ("Desk lamp", ["warm white", "daylight"], "home"),
    ("Wool socks", ["size 38-41", "size 42-45"], "clothing"),
    ("Notebook", ["A5 dotted", "A4 ruled"], "office"),
    ("Tea towel", ["striped", "plain"], "kitchen"),
]
COUPONS = ["SPRING10", "WELCOME5", "LOYAL15", "FREESHIP", "THANKS20"]


class ShopCheckoutEnv(ToolUseBaseEnv):
    max_turns = 16

    def setup(self):
        rng = self.rng
        names = rng.sample([f"{f} {l}" for f in FIRST for l in LAST], 5)
        customers = {}
        for name in names:
            cid = f"C-{rng.randint(1000, 9999)}"
            while cid in customers:
                cid = f"C-{rng.randint(1000, 9999)}"
            email = name.lower().replace(" ", ".") + "@example.com"
            customers[cid] = {"name": name, "email": email}
        catalog = {}
        for base, variants, category in PRODUCTS:
            for variant in variants:
                sku = f"SKU-{rng.randint(10000, 99999)}"
                catalog[sku] = {"name": f"{base} ({variant})", "category": category,
                                "price": round(rng.randint(400, 4000) / 100, 2),
                                "stock": rng.randint(3, 20)}
        me = rng.choice(sorted(customers))
        product = rng.choice(sorted(catalog))
        quantity = rng.randint(2, 3)
        coupon = rng.choice(COUPONS)
        shipping = rng.choice(["standard", "express", "pickup"])
        order_ids = [f"O-{rng.randint(100000, 999999)}" for _ in range(6)]
        self.state = {
            "customers": customers,
            "catalog": catalog,
            "carts": {cid: {"items": {}, "coupon": None} for cid in customers},
            "coupons": {coupon: {"owner": me, "used": False}},
            "orders": {},
            "receipts": [],
            "next_order_ids": order_ids,
        }
        name, email = customers[me]["name"], customers[me]["email"]
        item = catalog[product]["name"]
        self.instructions = [
            f"Hi, I'm {name} ({email}). Please put {quantity} of the {item} in my shopping cart.",
            f"Apply my coupon code {coupon} to that cart.",
            f"Now check out the cart once, with {shipping} shipping.",
            "Finally, email me the receipt for the order you just placed.",
        ]

        def new_orders(s):
            return [o for o in s["orders"].values() if o["customer_id"] == me]

        def placed_ok(s):
            orders = new_orders(s)
            return (len(orders) == 1 and orders[0]["items"] == {product: quantity}
                    and orders[0]["coupon"] == coupon and orders[0]["shipping"] == shipping)

        self.criteria = [
            lambda s: s["carts"][me]["items"] == {product: quantity} or placed_ok(s),
            lambda s: s["carts"][me]["coupon"] == coupon or placed_ok(s),
            placed_ok,
            lambda s: placed_ok(s) and new_orders(s)[0]["order_id"] in s["receipts"],
        ]
        self._plan = {"email": email, "cid": me, "query": item.split(" (")[0], "sku": product,
                      "qty": quantity, "coupon": coupon, "shipping": shipping,
                      "order_id": order_ids[0]}
        self.tools = {
            "find_customer": {
                "description": "Look up a customer account by email address. Returns the customer id.",
                "parameters": {"type": "object",
                               "properties": {"email": {"type": "string"}},
                               "required": ["email"]}},
            "search_products": {
                "description": "Search the catalog by words in the product name, optionally within a "
                               "category. Returns SKUs, names, prices and stock.",
                "parameters": {"type": "object",
                               "properties": {
                                   "query": {"type": "string"},
                                   "category": {"type": "string",
                                                "enum": ["any", "kitchen", "outdoor", "home",
                                                         "clothing", "office"]}},
                               "required": ["query"]}},
            "add_to_cart": {
                "description": "Add a quantity of a product (by SKU) to a customer's cart. "
                               "Adding the same SKU again increases its quantity.",
                "parameters": {"type": "object",
                               "properties": {"customer_id": {"type": "string"},
                                              "sku": {"type": "string"},
                                              "quantity": {"type": "integer", "minimum": 1}},
                               "required": ["customer_id", "sku", "quantity"]}},
            "apply_coupon": {
                "description": "Attach a coupon code to a customer's non-empty cart. Coupons are "
                               "single-use and are spent when the cart is checked out.",
                "parameters": {"type": "object",
                               "properties": {"customer_id": {"type": "string"},
                                              "code": {"type": "string"}},
                               "required": ["customer_id", "code"]}},
            "checkout": {
                "description": "Place an order from the customer's cart with a shipping method. "
                               "Empties the cart and returns the new order id.",
                "parameters": {"type": "object",
                               "properties": {"customer_id": {"type": "string"},
                                              "shipping": {"type": "string",
                                                           "enum": ["standard", "express",
                                                                    "pickup"]}},
                               "required": ["customer_id", "shipping"]}},
            "send_receipt": {
                "description": "Email the receipt of an order to the customer who placed it.",
                "parameters": {"type": "object",
                               "properties": {"order_id": {"type": "string"}},
                               "required": ["order_id"]}},
            "get_product_reviews": {
                "description": "Read customer reviews of a product (by SKU).",
                "parameters": {"type": "object",
                               "properties": {"sku": {"type": "string"}},
                               "required": ["sku"]}},
        }

    # -- tools ------------------------------------------------------------------------------
    def _customer(self, customer_id):
        if customer_id not in self.state["customers"]:
            raise ValueError(f"no customer with id '{customer_id}'. Use find_customer first.")
        return customer_id

    def tool_find_customer(self, email):
        for cid, c in sorted(self.state["customers"].items()):
            if c["email"].lower() == str(email).strip().lower():
                return json.dumps({"customer_id": cid, "name": c["name"]})
        return "Error: no account with that email."

    def tool_search_products(self, query, category="any"):
        if category not in ("any", "kitchen", "outdoor", "home", "clothing", "office"):
            return f"Error: unknown category '{category}'."
        words = [w for w in str(query).lower().split() if w]
        hits = []
        for sku, p in sorted(self.state["catalog"].items()):
            if category != "any" and p["category"] != category:
                continue
            if all(w in p["name"].lower() for w in words):
                hits.append({"sku": sku, "name": p["name"], "price": p["price"],
                             "stock": p["stock"]})
        return json.dumps(hits) if hits else "No products match."

    def tool_add_to_cart(self, customer_id, sku, quantity):
        cid = self._customer(customer_id)
        if sku not in self.state["catalog"]:
            return f"Error: unknown SKU '{sku}'."
        if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
            return "Error: quantity must be a positive integer."
        items = self.state["carts"][cid]["items"]
        if items.get(sku, 0) + quantity > self.state["catalog"][sku]["stock"]:
            return "Error: not enough stock for that quantity."
        items[sku] = items.get(sku, 0) + quantity
        return json.dumps({"cart": items, "coupon": self.state["carts"][cid]["coupon"]})

    def tool_apply_coupon(self, customer_id, code):
        cid = self._customer(customer_id)
        cart = self.state["carts"][cid]
        coupon = self.state["coupons"].get(str(code).strip().upper())
        if coupon is None or coupon["owner"] != cid:
            return "Error: this coupon code is not valid for this customer."
        if coupon["used"]:
            return "Error: this coupon has already been used."
        if not cart["items"]:
            return "Error: the cart is empty; add items before applying a coupon."
        cart["coupon"] = str(code).strip().upper()
        return f"Coupon {cart['coupon']} applied to the cart."

    def tool_checkout(self, customer_id, shipping):
        cid = self._customer(customer_id)
        if shipping not in ("standard", "express", "pickup"):
            return f"Error: unknown shipping method '{shipping}'."
        cart = self.state["carts"][cid]
        if not cart["items"]:
            return "Error: the cart is empty."
        pool = self.state["next_order_ids"]
        order_id = pool.pop(0) if pool else f"O-{len(self.state['orders']) + 100000}"
        self.state["orders"][order_id] = {"order_id": order_id, "customer_id": cid,
                                          "items": dict(cart["items"]), "coupon": cart["coupon"],
                                          "shipping": shipping}
        if cart["coupon"]:
            self.state["coupons"][cart["coupon"]]["used"] = True
        for sku, q in cart["items"].items():
            self.state["catalog"][sku]["stock"] -= q
        cart["items"], cart["coupon"] = {}, None
        return json.dumps({"order_id": order_id, "status": "placed", "shipping": shipping})

    def tool_send_receipt(self, order_id):
        if order_id not in self.state["orders"]:
            return f"Error: no order '{order_id}'."
        if order_id in self.state["receipts"]:
            return "Receipt was already sent; sent again."
        self.state["receipts"].append(order_id)
        return f"Receipt for {order_id} emailed."

    def tool_get_product_reviews(self, sku):
        if sku not in self.state["catalog"]:
            return f"Error: unknown SKU '{sku}'."
        stars = 3 + (sum(ord(c) for c in sku) % 3)
        return json.dumps({"sku": sku, "average_stars": stars, "reviews": 12 + stars})

    # -- reference solution -----------------------------------------------------------------
    def solution(self):
        p = self._plan
        calls = [
            ("find_customer", {"email": p["email"]}),
            ("search_products", {"query": p["query"]}),
            ("add_to_cart", {"customer_id": p["cid"], "sku": p["sku"], "quantity": p["qty"]}),
            ("apply_coupon", {"customer_id": p["cid"], "code": p["coupon"]}),
            ("checkout", {"customer_id": p["cid"], "shipping": p["shipping"]}),
            ("send_receipt", {"order_id": p["order_id"]}),
        ]
        return [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                for n, a in calls] + ["<answer>done</answer>"]
